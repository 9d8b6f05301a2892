"""Prometheus metrics both sides share: the registry, Redis round trips, and the text exposition.

Every process (each front door, each worker) exports its own metrics; names follow vLLM's style
(`switchboard:time_to_first_token_seconds` beside `vllm:time_to_first_token_seconds`), so that
dashboards written for one translate to the other. The front door's metrics are in
`router.telemetry.front_door_metrics`, the worker's in `workers.runtime.worker_metrics`; both register in `REGISTRY`.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    generate_latest,
)

# One registry per process for Switchboard's metrics (and the process's own: CPU, memory, GC).
REGISTRY = CollectorRegistry(auto_describe=True)
for _collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_collector)

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Latency buckets (seconds), as vLLM's time-to-first-token and end-to-end histograms have them.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
    0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
QUEUE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, *REQUEST_BUCKETS[1:])
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)

REDIS_ROUND_TRIPS = Counter(
    "switchboard:redis_round_trips",
    "Round trips to Redis (a command, or a whole pipeline), by the client that made them.",
    ["client"],
    registry=REGISTRY,
)


def exposition() -> bytes:
    """This process's metrics in Prometheus's text format."""
    return generate_latest(REGISTRY)


def count_round_trips(client: aioredis.Redis, name: str) -> aioredis.Redis:
    """Count every round trip `client` makes, as `switchboard:redis_round_trips_total{client=name}`.

    A command and a whole pipeline are each sent with one `send_packed_command`: counting those
    counts round trips. Returns `client`.
    """
    pool = client.connection_pool
    pool.connection_class = _counting(pool.connection_class, REDIS_ROUND_TRIPS.labels(name))
    return client


_counting_classes: dict[tuple[type[Any], int], type[Any]] = {}


def _counting(connection_class: type[Any], counter: Any) -> type[Any]:
    key = (connection_class, id(counter))
    if key not in _counting_classes:

        async def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
            counter.inc()
            await connection_class.send_packed_command(self, command, check_health)

        _counting_classes[key] = type(
            f"Counting{connection_class.__name__}",
            (connection_class,),
            {"send_packed_command": send_packed_command},
        )
    return _counting_classes[key]
