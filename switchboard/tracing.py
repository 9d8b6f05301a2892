"""OpenTelemetry tracing for both sides: off unless the standard `OTEL_*` variables ask for it.

Tracing is on in a process when its environment names an exporter:

- `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`): OTLP, over HTTP/protobuf
  unless `OTEL_EXPORTER_OTLP_PROTOCOL` (or `..._TRACES_PROTOCOL`) says `grpc`;
- `OTEL_TRACES_EXPORTER=otlp` or `console`;
- `SWITCHBOARD_TRACE_FILE=PATH`: every finished span as one JSON line appended to PATH (a look
  without a collector, and what the tests read).

`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` keeps it off. Everything else (service
name, resource attributes, sampler, batch sizes and delays) is the SDK's own reading of `OTEL_*`.

Off, nothing here creates a span object: `span()` hands back one shared empty context manager, and
the callers that time hops by hand test `enabled()` first. On, spans go through a
BatchSpanProcessor, whose queue drops spans rather than ever blocking a request.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

logger = logging.getLogger(__name__)

TRACE_FILE_ENV = "SWITCHBOARD_TRACE_FILE"
INSTRUMENTATION_NAME = "switchboard"
# A key of the trace carrier a job takes through Redis: when the front door sent it (unix ns), so
# that the worker can tell how long the job waited in the queue.
ENQUEUED_KEY = "sb-enqueued-ns"

_enabled = False
_tracer: Any = None
_provider: Any = None
_NO_SPAN: AbstractContextManager[None] = contextlib.nullcontext()


def enabled() -> bool:
    """Whether this process records spans."""
    return _enabled


def requested(environ: Mapping[str, str] | None = None) -> str | None:
    """Which exporter the environment asks for ("otlp", "console", "file"), or None for none."""
    environ = os.environ if environ is None else environ
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if environ.get(TRACE_FILE_ENV):
        return "file"
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return None
    if exporter in ("otlp", "console"):
        return exporter
    if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return "otlp"
    return None


def configure_tracing(service_name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Set up this process's tracer if the environment asks for one; returns whether tracing is on.

    `service_name` is the default `service.name` (`OTEL_SERVICE_NAME` wins). Idempotent.
    """
    global _enabled, _tracer, _provider
    environ = os.environ if environ is None else environ
    kind = requested(environ)
    if kind is None or _enabled:
        return _enabled
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(_exporter(kind, environ)))
    trace.set_tracer_provider(provider)
    _provider = provider
    _tracer = provider.get_tracer(INSTRUMENTATION_NAME)
    _enabled = True
    atexit.register(shutdown_tracing)
    logger.info("tracing on", extra={"exporter": kind, "service": service_name})
    return True


def use_tracer_provider(provider: Any) -> None:
    """Record spans with `provider` (tests with an in-memory exporter); None turns tracing off."""
    global _enabled, _tracer, _provider
    _provider = provider
    _tracer = provider.get_tracer(INSTRUMENTATION_NAME) if provider is not None else None
    _enabled = provider is not None


def shutdown_tracing() -> None:
    """Export what is queued and stop the exporter (the process is ending)."""
    global _enabled
    if _provider is not None and _enabled:
        _enabled = False
        with contextlib.suppress(Exception):
            _provider.shutdown()


def _exporter(kind: str, environ: Mapping[str, str]) -> Any:
    if kind == "file":
        return JsonLinesExporter(Path(environ[TRACE_FILE_ENV]))
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    )
    if protocol.strip().lower() == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter()


# --- spans --------------------------------------------------------------------------------------


def tracer() -> Any:
    """The process's tracer (only while `enabled()`)."""
    return _tracer


def span(name: str, attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[Any]:
    """A child of the current span, current inside the block; off, one shared empty context."""
    if not _enabled:
        return _NO_SPAN
    attributes = {**request_attributes(), **(attributes or {})}
    return _tracer.start_as_current_span(name, attributes=attributes)  # type: ignore[no-any-return]


def start_span(
    name: str,
    *,
    parent: Any = None,
    start_ns: int | None = None,
    attributes: Mapping[str, Any] | None = None,
    kind: Any = None,
) -> Any:
    """A span started now (or at `start_ns`), under `parent` (a context; None: the current one).

    Only while `enabled()`; the caller ends it.
    """
    from opentelemetry.trace import SpanKind

    return _tracer.start_span(
        name,
        context=parent,
        kind=kind if kind is not None else SpanKind.INTERNAL,
        attributes={**request_attributes(), **(attributes or {})},
        start_time=start_ns,
    )


def record_span(
    name: str,
    start_ns: int,
    end_ns: int,
    *,
    parent: Any = None,
    attributes: Mapping[str, Any] | None = None,
) -> None:
    """A span of a hop timed by hand, from `start_ns` to `end_ns` (unix ns); only while `enabled()`."""
    recorded = start_span(name, parent=parent, start_ns=start_ns, attributes=attributes)
    recorded.end(end_time=max(start_ns, end_ns))


def context_with(span_: Any) -> Any:
    """A context whose current span is `span_`: the parent for spans made elsewhere."""
    from opentelemetry import trace

    return trace.set_span_in_context(span_)


@contextlib.contextmanager
def current(span_: Any) -> Iterator[None]:
    """Make `span_` the current span inside the block (without ending it)."""
    from opentelemetry import context

    token = context.attach(context_with(span_))
    try:
        yield
    finally:
        context.detach(token)


def carrier_of(span_: Any, **extra: str) -> dict[str, str]:
    """The W3C trace context (`traceparent`, `tracestate`) naming `span_` as the parent, plus `extra`."""
    from opentelemetry.propagate import inject

    carrier: dict[str, str] = {}
    inject(carrier, context=context_with(span_))
    carrier.update(extra)
    return carrier


def context_from(carrier: Mapping[str, str] | None) -> Any:
    """The remote parent named by a W3C carrier (HTTP headers, a job's `trace`); None if none."""
    if not carrier:
        return None
    from opentelemetry.propagate import extract

    return extract(carrier)


def now_ns() -> int:
    """Unix time in nanoseconds, as spans take it."""
    return time.time_ns()


# --- a file of JSON lines ------------------------------------------------------------------------


class JsonLinesExporter:
    """Appends every span, one JSON object a line, to a file that several processes may share.

    Each line holds what a per-hop breakdown needs: names, ids, parent, times (unix ns), attributes,
    events and the service that recorded it.
    """

    def __init__(self, path: Path) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        lines = "".join(json.dumps(span_record(s), default=str) + "\n" for s in spans)
        with self._lock:
            # One write of whole lines, appended: lines of several processes never interleave.
            fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, lines.encode())
            finally:
                os.close(fd)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def span_record(finished: Any) -> dict[str, Any]:
    """A finished span as plain data (the file exporter's line, and what tests compare)."""
    context = finished.get_span_context()
    parent = finished.parent
    return {
        "name": finished.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
        "remote_parent": bool(parent is not None and parent.is_remote),
        "kind": finished.kind.name,
        "start_ns": finished.start_time,
        "end_ns": finished.end_time,
        "status": finished.status.status_code.name,
        "attributes": dict(finished.attributes or {}),
        "events": [
            {"name": e.name, "time_ns": e.timestamp, "attributes": dict(e.attributes or {})}
            for e in finished.events
        ],
        "service": finished.resource.attributes.get("service.name"),
    }


# --- log lines ---------------------------------------------------------------------------------


class TraceIds:
    """A logging filter that adds the current span's `trace_id` and `span_id` to a record (tracing on)."""

    def filter(self, record: Any) -> bool:
        if _enabled and not hasattr(record, "trace_id"):
            from opentelemetry import trace

            context = trace.get_current_span().get_span_context()
            if context.is_valid:
                record.trace_id = f"{context.trace_id:032x}"
                record.span_id = f"{context.span_id:016x}"
        return True


trace_ids = TraceIds()


# --- the request a span or a log line belongs to -----------------------------------------------

# The span attribute and log field naming the request: its job's id once it has a job (what the
# response's `x-request-id` says), and what its client sent as `x-request-id`, if anything.
REQUEST_ID = "switchboard.request_id"
CLIENT_REQUEST_ID = "switchboard.client_request_id"


class RequestIds(Protocol):
    """The ids of the request being handled (the front door's `RequestObservation`)."""

    @property
    def request_id(self) -> str: ...

    @property
    def client_request_id(self) -> str | None: ...


_request: contextvars.ContextVar[RequestIds | None] = contextvars.ContextVar(
    "switchboard_request_ids", default=None
)


def bind_request(ids: RequestIds) -> contextvars.Token[RequestIds | None]:
    """Spans started and lines logged from here on (in this context and the tasks it starts) name
    the request `ids`; `unbind_request` with the token ends that. The ids are read when each span
    starts and each line is logged, so a request id that changes (to its job's) is followed."""
    return _request.set(ids)


def unbind_request(token: contextvars.Token[RequestIds | None]) -> None:
    _request.reset(token)


def bound_request() -> RequestIds | None:
    """The ids of the request being handled here, if any."""
    return _request.get()


def request_attributes() -> dict[str, str]:
    """The current request's ids as span attributes (none outside a request)."""
    ids = _request.get()
    if ids is None:
        return {}
    found = {REQUEST_ID: ids.request_id}
    if ids.client_request_id:
        found[CLIENT_REQUEST_ID] = ids.client_request_id
    return found


class RequestIdFields:
    """A logging filter that adds the current request's `request_id` (and `client_request_id`) to a
    record, unless the record names them itself."""

    def filter(self, record: Any) -> bool:
        ids = _request.get()
        if ids is not None and not hasattr(record, "request_id"):
            record.request_id = ids.request_id
            if ids.client_request_id:
                record.client_request_id = ids.client_request_id
        return True


request_ids = RequestIdFields()
