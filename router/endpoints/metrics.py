"""`GET /metrics`: the front door's metrics in Prometheus's text format."""

from __future__ import annotations

import contextlib

from litestar import Response, get
from redis.exceptions import RedisError

from router.queue.results import ResultReader
from router.status.model_status import ModelStatusReader, QueueDepths
from router.status.redis_health import RedisHealth
from router.telemetry.front_door_metrics import OLDEST_WAITING, QUEUE_DEPTH, REQUESTS_IN_FLIGHT
from switchboard.metrics import CONTENT_TYPE, exposition

# Scrapes share one read of the queues this recent: open to anyone, a flood of them costs Redis
# nothing more (Prometheus scrapes every 15 s or so).
QUEUES_MAX_AGE_S = 1.0


@get("/metrics", include_in_schema=False)
async def metrics(status: ModelStatusReader, health: RedisHealth, reader: ResultReader) -> Response[bytes]:
    """This front door's metrics in Prometheus's text format (no API key needed, like /healthz)."""
    REQUESTS_IN_FLIGHT.set(reader.in_flight)
    depths: QueueDepths = {}
    # Redis down: the queue gauges keep their last values; the rest still reports.
    if health.up:
        with contextlib.suppress(RedisError):
            depths = await status.queue_depths(QUEUES_MAX_AGE_S)
    for model, (waiting, oldest_s) in depths.items():
        QUEUE_DEPTH.labels(model).set(waiting)
        OLDEST_WAITING.labels(model).set(oldest_s)
    return Response(exposition(), media_type=CONTENT_TYPE)
