"""`GET /metrics`: the front door's metrics in Prometheus's text format."""

from __future__ import annotations

import contextlib

import redis.asyncio as aioredis
from litestar import Response, get
from redis.exceptions import RedisError

from router.admission.models import ModelTable
from router.queue.results import ResultReader
from router.status.redis_health import RedisHealth
from router.telemetry.metrics import OLDEST_WAITING, QUEUE_DEPTH, REQUESTS_IN_FLIGHT, queue_depths
from switchboard.metrics import CONTENT_TYPE, exposition


@get("/metrics", include_in_schema=False)
async def metrics(
    redis: aioredis.Redis, models: ModelTable, health: RedisHealth, reader: ResultReader
) -> Response[bytes]:
    """This front door's metrics in Prometheus's text format (no API key needed, like /healthz)."""
    REQUESTS_IN_FLIGHT.set(reader.in_flight)
    depths: dict[str, tuple[int, float]] = {}
    # Redis down: the queue gauges keep their last values; the rest still reports.
    if health.up:
        with contextlib.suppress(RedisError):
            depths = await queue_depths(redis, models.names())
    for model, (waiting, oldest_s) in depths.items():
        QUEUE_DEPTH.labels(model).set(waiting)
        OLDEST_WAITING.labels(model).set(oldest_s)
    return Response(exposition(), media_type=CONTENT_TYPE)
