"""The front door's Prometheus metrics (served by `router.endpoints.metrics`).

Requests are counted by model and HTTP status, and timed from the moment the request arrived: to
the first result chunk (time to first token), to the last byte (end to end), and per output token
between the two. The queue's depth and the age of its oldest job are read from Redis when scraped
(two pipelined round trips for all models), so every front door reports the same queues.
"""

from __future__ import annotations

import time
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import Counter, Gauge, Histogram
from redis.exceptions import ResponseError

from switchboard import keys
from switchboard.metrics import REGISTRY, REQUEST_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS

REQUESTS = Counter(
    "switchboard:requests",
    "Requests answered by the front door, by model and HTTP status (model is empty when unknown).",
    ["model", "status"],
    registry=REGISTRY,
)
REQUEST_SUCCESS = Counter(
    "switchboard:request_success",
    "Choices that finished, by model and finish reason (as vllm:request_success_total).",
    ["model", "finished_reason"],
    registry=REGISTRY,
)
TIME_TO_FIRST_TOKEN = Histogram(
    "switchboard:time_to_first_token_seconds",
    "From the request's arrival to its first result chunk at the front door.",
    ["model"],
    buckets=TTFT_BUCKETS,
    registry=REGISTRY,
)
TIME_PER_OUTPUT_TOKEN = Histogram(
    "switchboard:time_per_output_token_seconds",
    "A request's time per output token after its first: (last chunk - first chunk) / (tokens - 1).",
    ["model"],
    buckets=TPOT_BUCKETS,
    registry=REGISTRY,
)
E2E_LATENCY = Histogram(
    "switchboard:e2e_request_latency_seconds",
    "From the request's arrival to its last byte.",
    ["model"],
    buckets=REQUEST_BUCKETS,
    registry=REGISTRY,
)
PROMPT_TOKENS = Counter(
    "switchboard:prompt_tokens", "Prompt tokens of finished requests.", ["model"], registry=REGISTRY
)
GENERATION_TOKENS = Counter(
    "switchboard:generation_tokens", "Tokens generated for finished requests.", ["model"], registry=REGISTRY
)
REQUESTS_IN_FLIGHT = Gauge(
    "switchboard:num_requests_in_flight",
    "Jobs this front door is waiting on (queued or running).",
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge(
    "switchboard:num_requests_waiting",
    "Jobs on the model's stream that no worker has taken yet (every front door reports it).",
    ["model"],
    registry=REGISTRY,
)
OLDEST_WAITING = Gauge(
    "switchboard:oldest_waiting_seconds",
    "How long the oldest job no worker has taken has waited (0 when none waits).",
    ["model"],
    registry=REGISTRY,
)


async def queue_depths(redis: aioredis.Redis, models: list[str]) -> dict[str, tuple[int, float]]:
    """Per model: jobs no worker has taken, and the age (seconds) of the oldest of them.

    Taken jobs are acknowledged and deleted when they end, so the waiting ones are those after the
    consumer group's last delivered entry; an entry id is its enqueue time on Redis's clock (ms).
    """
    pipe = redis.pipeline(transaction=False)
    for model in models:
        pipe.xlen(keys.job_stream(model))
        pipe.xinfo_groups(keys.job_stream(model))
    replies = await pipe.execute(raise_on_error=False)
    after: dict[str, tuple[int, str]] = {}
    for index, model in enumerate(models):
        length, groups = replies[2 * index], replies[2 * index + 1]
        if isinstance(length, ResponseError):
            raise length
        group = _job_group(groups)
        if group is None:  # no worker has joined yet: every entry waits
            after[model] = (int(length), "-")
            continue
        lag = group.get("lag")
        last = _text(group.get("last-delivered-id", b"0-0"))
        waiting = int(lag) if lag is not None else max(0, int(length) - int(group.get("pending", 0)))
        after[model] = (waiting, f"({last}")
    waiting_models = [model for model, (waiting, _) in after.items() if waiting > 0]
    oldest: dict[str, float] = {}
    if waiting_models:
        pipe = redis.pipeline(transaction=False)
        for model in waiting_models:
            pipe.xrange(keys.job_stream(model), min=after[model][1], count=1)
        now_ms = time.time() * 1000
        for model, entries in zip(waiting_models, await pipe.execute(raise_on_error=False), strict=True):
            if isinstance(entries, list) and entries:
                enqueued_ms = int(_text(entries[0][0]).split("-", 1)[0])
                oldest[model] = max(0.0, (now_ms - enqueued_ms) / 1000)
    return {model: (waiting, oldest.get(model, 0.0)) for model, (waiting, _) in after.items()}


def _job_group(groups: Any) -> dict[str, Any] | None:
    if not isinstance(groups, list):
        return None  # ResponseError: the stream does not exist yet
    for group in groups:
        if _text(group.get("name", b"")) == keys.JOB_GROUP:
            return dict(group)
    return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
