"""Health checks: `/healthz` (the process serves HTTP) and `/readyz` (it can take work)."""

from __future__ import annotations

from litestar import Response, get
from redis.exceptions import RedisError

from router.admission.models import ModelTable
from router.http.responses import Health, json_response
from router.openai.errors import ServiceUnavailableError
from router.status.models import ModelStatusReader, may_serve
from router.status.redis_health import RedisHealth
from switchboard.config import Settings
from switchboard.readiness import NO_LIVE_WORKER, NO_WORKER_FOR_MODEL, REDIS_UNREACHABLE

# A probe reads the worker records afresh (a worker that just started is seen at once).
READYZ_MAX_AGE_S = 0.0


@get("/healthz")
async def healthz() -> Response[bytes]:
    """The process is up and serving HTTP."""
    return json_response(Health(status="ok"))


@get("/readyz")
async def readyz(
    settings: Settings,
    models: ModelTable,
    health: RedisHealth,
    status: ModelStatusReader,
    model: str | None = None,
) -> Response[bytes]:
    """Ready when Redis answers and at least one worker is alive (or without any, with
    `router.ready_without_workers`); with `?model=NAME`, when some live worker may hold that model.
    The body tells, per model, whether a live worker may hold it."""
    if not health.up:
        raise ServiceUnavailableError(
            "Redis is unreachable; the front door retries it.", code=REDIS_UNREACHABLE
        )
    try:
        records = await status.live_workers(READYZ_MAX_AGE_S)
    except RedisError as exc:
        health.unavailable(exc)  # marks Redis down on a lost connection
        raise ServiceUnavailableError(f"Redis is unreachable: {exc}", code=REDIS_UNREACHABLE) from exc
    if not records and not settings.router.ready_without_workers:
        raise ServiceUnavailableError(
            "No worker is alive yet; start one with `switchboard worker`.", code=NO_LIVE_WORKER
        )
    if model is not None:
        models.require(model)
        if not may_serve(records, model):
            raise ServiceUnavailableError(
                f"No live worker may hold the model `{model}`.", code=NO_WORKER_FOR_MODEL
            )
    served = {name: may_serve(records, name) for name in models.names()}
    return json_response(Health(status="ready", workers=len(records), models=served))
