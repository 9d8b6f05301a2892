"""What a front door saw of a running rollout's targets, counted in memory and flushed to Redis.

Every job that came through a route whose rollout runs is counted, when the request is done with it,
for its model (the stable target or the canary) in the rollout's current window: one request; a
failure if it ended in an engine or server error (a `JobError` engine_error, load_failed or
timeout, a 5xx on its way, or a refusal before it was queued, `record_refused`) but not for the
client's own mistakes (invalid_request, 4xx), which say nothing of the model and are not counted at
all; its time to first token and inter-token latency as histogram bucket counts
(`switchboard.rollout`), so that a p95 comes from counts summed over every front door. A request
whose first chunk waited for a model load (`Chunk.cold_start`) counts as cold and its time to first
token is left out. A client that left before the end is not counted.

Each request is also counted for its caller (`judged_as`: its API key, else its stickiness key;
stored as a digest), so that the judge counts callers, not requests (`switchboard.rollout`): one
caller that sends many requests is one vote. A request whose caller was not noted counts for one
shared caller, never as a caller of its own.

Counts are flushed about every FLUSH_S as HINCRBY into one hash per (route, rollout, window)
(`keys.rollout_window`) in one pipeline, so that a request costs no round trip and the judge sums
every front door's counts. Each front door owns its `Observations` (`router.front_door`): its
job observers count into it, and its rollout judge flushes it.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard import keys
from switchboard.rollout import RolloutState, Window, bucket_index
from switchboard.routes import Route
from switchboard.tasks import TaskSet, poll

logger = logging.getLogger(__name__)

FLUSH_S = 1.0
# The jobs' error codes that count against a model (the rest are the client's).
FAILURE_CODES = frozenset({"engine_error", "load_failed", "timeout"})
# A caller's counters: `{model}:caller:{digest}` (its requests), `{model}:caller_failed:{digest}`.
CALLER_DIGEST_CHARS = 16
_CALLER_FIELD = re.compile(
    rf"(?P<model>.+):(?P<counter>caller|caller_failed):(?P<caller>[0-9a-f]{{{CALLER_DIGEST_CHARS}}})"
)
# Who the request being handled comes from, as a digest (`judged_as`); until noted, one for all.
UNNOTED_CALLER = "0" * CALLER_DIGEST_CHARS
_caller: ContextVar[str] = ContextVar("switchboard_rollout_caller", default=UNNOTED_CALLER)


def judged_as(identity: str) -> None:
    """The request being handled comes from the caller `identity` (its key's, or its stickiness key
    when keys are off): its jobs count once for that caller in a rollout's windows."""
    _caller.set(hashlib.sha256(identity.encode()).hexdigest()[:CALLER_DIGEST_CHARS])


class RouteSource(Protocol):
    def get(self, name: str) -> Route | None: ...


# (route, rollout id, window) → counter field → count
_Pending = dict[tuple[str, str, int], Counter[str]]


class Observations:
    """In-memory counts of running rollouts' targets, flushed to Redis."""

    def __init__(self) -> None:
        self._routes: list[RouteSource] = []
        self._pending: _Pending = {}

    def watch(self, routes: RouteSource) -> None:
        """Read rollouts' states from `routes` (a front door's route table) while it runs."""
        self._routes.append(routes)

    def unwatch(self, routes: RouteSource) -> None:
        if routes in self._routes:
            self._routes.remove(routes)

    def record(
        self,
        route: str,
        model: str,
        *,
        failed: bool,
        cold: bool = False,
        ttft_s: float | None = None,
        itl_s: float | None = None,
    ) -> None:
        """One request of `route` served by `model` ended (see the module's rules)."""
        counts = self._counts(route, model)
        if counts is None:
            return
        caller = _caller.get()
        counts[f"{model}:requests"] += 1
        counts[f"{model}:caller:{caller}"] += 1
        if failed:
            counts[f"{model}:failures"] += 1
            counts[f"{model}:caller_failed:{caller}"] += 1
        if cold:
            counts[f"{model}:cold"] += 1
        elif ttft_s is not None:
            counts[f"{model}:ttft:{bucket_index(ttft_s)}"] += 1
        if itl_s is not None:
            counts[f"{model}:itl:{bucket_index(itl_s)}"] += 1

    def record_refused(self, route: str, model: str) -> None:
        """A request of `route` for `model` was refused with a 5xx before its job existed."""
        self.record(route, model, failed=True)

    def _counts(self, route: str, model: str) -> Counter[str] | None:
        state = self._rollout(route)
        if state is None or not state.running or model not in (state.stable, state.plan.canary):
            return None
        return self._pending.setdefault((route, state.id, state.window), Counter())

    def _rollout(self, route: str) -> RolloutState | None:
        for routes in self._routes:
            found = routes.get(route)
            if found is not None:
                return found.rollout
        return None

    async def flush(self, redis: aioredis.Redis) -> None:
        """Add what was counted since the last flush to the windows in Redis (kept for the next
        flush if Redis refuses)."""
        if not self._pending:
            return
        taken, self._pending = self._pending, {}
        pipe = redis.pipeline(transaction=False)
        for (route, rollout_id, window), counts in taken.items():
            key = keys.rollout_window(route, rollout_id, window)
            for field, count in counts.items():
                pipe.hincrby(key, field, count)
            pipe.expire(key, keys.ROLLOUT_WINDOW_TTL_S)
        try:
            await pipe.execute()
        except RedisError:
            for slot, counts in taken.items():
                self._pending.setdefault(slot, Counter()).update(counts)
            raise

    def start(self, redis: aioredis.Redis, tasks: TaskSet) -> None:
        """Flush every FLUSH_S while `tasks` runs."""
        tasks.start(
            poll(lambda: self.flush(redis), FLUSH_S, "flush the rollouts' observations", log=logger),
            "rollout observations",
        )


async def read_window(
    redis: aioredis.Redis, route: str, rollout_id: str, window: int, models: Sequence[str]
) -> dict[str, Window]:
    """Every front door's counts for `models` in one window of a rollout, summed."""
    fields = await redis.hgetall(keys.rollout_window(route, rollout_id, window))  # type: ignore[misc]
    return windows_from(fields.items(), models)


def windows_from(
    fields: Iterable[tuple[bytes | str, bytes | str]], models: Sequence[str]
) -> dict[str, Window]:
    """The `Window` of each of `models` in a window hash's fields."""
    found = {model: Window() for model in models}
    for raw_field, raw_count in fields:
        text = raw_field.decode() if isinstance(raw_field, bytes) else raw_field
        if _counted_for_caller(found, text, int(raw_count)):
            continue
        model, _, counter = text.rpartition(":")
        index: int | None = None
        if counter.isdigit():
            index = int(counter)
            model, _, counter = model.rpartition(":")
        window = found.get(model)
        if window is None:
            continue
        count = int(raw_count)
        if counter == "requests":
            window.requests += count
        elif counter == "failures":
            window.failures += count
        elif counter == "cold":
            window.cold += count
        elif counter in ("ttft", "itl") and index is not None:
            histogram = window.ttft if counter == "ttft" else window.itl
            histogram[index] = histogram.get(index, 0) + count
    return found


def _counted_for_caller(found: dict[str, Window], field: str, count: int) -> bool:
    """Add `count` to a window's caller's counter if `field` is one; whether it was."""
    matched = _CALLER_FIELD.fullmatch(field)
    if matched is None:
        return False
    window = found.get(matched["model"])
    if window is not None:
        counts = window.caller_requests if matched["counter"] == "caller" else window.caller_failures
        counts[matched["caller"]] = counts.get(matched["caller"], 0) + count
    return True
