"""Health checks: `/healthz` (the process serves HTTP) and `/readyz` (it can take work).

Both are open to anyone (probes carry no key), so neither says more than a probe needs nor costs
Redis anything per call: `/readyz` shares one read of the worker records a second with every other
caller, names models only to a caller whose key may use them (every model while auth is off), and
never repeats Redis's own words or address. Its `?model=NAME` asks about one model, so it needs
such a key too: without one, every name, known or not, gets the same 401.
"""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response, get
from redis.exceptions import RedisError

from router.admission.auth import caller_of
from router.admission.model_table import ModelTable
from router.http.answers import Health, json_response
from router.openai.errors import OpenAIError, ServiceUnavailableError
from router.status.model_status import ModelStatusReader, may_serve
from router.status.redis_health import RedisHealth
from switchboard.config import Settings
from switchboard.readiness import ENGINES_PREPARING, NO_LIVE_WORKER, NO_WORKER_FOR_MODEL, REDIS_UNREACHABLE

logger = logging.getLogger(__name__)

# Probes share one read of the live workers' records this recent: a flood of them costs Redis
# nothing more, and a worker that just started is seen within this.
READYZ_MAX_AGE_S = 1.0


@get("/healthz")
async def healthz() -> Response[bytes]:
    """The process is up and serving HTTP."""
    return json_response(Health(status="ok"))


@get("/readyz")
async def readyz(
    request: Request[Any, Any, Any],
    settings: Settings,
    models: ModelTable,
    health: RedisHealth,
    status: ModelStatusReader,
    model: str | None = None,
) -> Response[bytes]:
    """Ready when Redis answers and at least one worker is alive with its engines prepared (or
    without any, with `router.ready_without_workers`); with `?model=NAME`, when some live worker
    may hold that model.
    The body tells, per model the caller's key may use, whether a live worker may hold it.

    A plain `/readyz` is open: what Kubernetes' and load balancers' probes call, with no key. While
    auth is on, `?model=NAME` answers only a key that may use the model, as a request to it would
    (401 without a known key, whatever the name; then 404 for an unknown model, 403 for one the key
    may not use): an answer that differed for a known and an unknown name would tell anyone which
    models exist. A per-model probe sends a key (`httpHeaders` of a Kubernetes probe), or checks
    the plain `/readyz` body's `models`, which a key's request lists.
    """
    if model is not None:
        models.resolve(model, await caller_of(request))
    if not health.up:
        raise _redis_unreachable()
    try:
        records = await status.live_workers(READYZ_MAX_AGE_S)
    except RedisError as exc:
        health.unavailable(exc)  # marks Redis down on a lost connection
        logger.warning("readyz could not read the worker records", extra={"error": str(exc)})
        raise _redis_unreachable() from exc
    if not records and not settings.router.ready_without_workers:
        raise ServiceUnavailableError(
            "No worker is alive yet; start one with `switchboard worker`.", code=NO_LIVE_WORKER
        )
    # (A front door that is ready without workers stays so while the first one prepares: it must
    # stay in its Service to take the requests that woke that worker.)
    preparing = records and not any(record.engines_ready for record in records)
    if preparing and not settings.router.ready_without_workers:
        raise ServiceUnavailableError(
            "The workers are still preparing their engines; a first request would wait for that.",
            code=ENGINES_PREPARING,
        )
    if model is not None and not may_serve(records, model):
        raise ServiceUnavailableError(
            f"No live worker may hold the model `{model}`.", code=NO_WORKER_FOR_MODEL
        )
    shown = await _models_shown(request, models)
    served = {name: may_serve(records, name) for name in shown} if shown else None
    prepared = sum(record.engines_ready for record in records)
    return json_response(
        Health(status="ready", workers=len(records), workers_prepared=prepared, models=served)
    )


async def _models_shown(request: Request[Any, Any, Any], models: ModelTable) -> list[str]:
    """The models the request's key may use; none without a known key while auth is on."""
    try:
        caller = await caller_of(request)
    except (OpenAIError, RedisError):
        return []
    return [name for name in models.names() if caller.may_use(name)]


def _redis_unreachable() -> ServiceUnavailableError:
    return ServiceUnavailableError("Redis is unreachable; the front door retries it.", code=REDIS_UNREACHABLE)
