"""The HTTP handlers: OpenAI's `v1`, the health checks, the operator's `admin` and `metrics`; thin, they call `router.flow`."""
