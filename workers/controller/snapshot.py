"""Read what one decision needs from Redis and from this worker's slots, and shape it as a `View`.

Two round trips per pass: one pipeline (queue depth and oldest waiting job of every model, via a
script; replica leases; failed loads; operator requests; measured costs; the live workers), then
the live workers' records. Job bodies are never read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis

from switchboard import keys
from switchboard.config import ModelConfig
from switchboard.queue_depth import JobsWaiting, decode_depths
from switchboard.wire import (
    DesiredState,
    SlotStatus,
    WorkerRecord,
    desired_state_decoder,
    load_failure_decoder,
    worker_decoder,
)
from workers.controller.coordination import typical
from workers.controller.view import ModelView, View, WorkerLimits
from workers.models.slot import ModelSlot

# Replica numbers looked at when a model sets no max_replicas.
REPLICAS_TRACKED = 16
GIB = 1024**3


@dataclass(frozen=True)
class LocalFacts:
    """This worker's side of a decision, read from its own slots and settings."""

    worker_id: str
    limits: WorkerLimits
    # Models whose transition the controller has started but whose slot has not changed yet.
    starting: frozenset[str]
    # Preloaded models this worker has not yet seen held anywhere.
    preload_pending: frozenset[str]
    # This worker's own backoff after failed loads (a model may fail here and work elsewhere).
    backoff_until: dict[str, float]


class SnapshotReader:
    """Builds the controller's View of the models one worker may hold."""

    def __init__(
        self,
        redis: aioredis.Redis,
        models: list[ModelConfig],
        slots: Mapping[str, ModelSlot],
        *,
        kind: str,
        expected_footprint: Callable[[ModelConfig, list[bytes]], int],
    ) -> None:
        self._redis = redis
        self._models = models
        self._slots = slots
        self._kind = kind
        self._expected_footprint = expected_footprint
        self._jobs_waiting = JobsWaiting(redis)

    async def read(self, local: LocalFacts) -> View:
        """One consistent-enough snapshot of demand, holders and costs."""
        now = time.time()
        raw = await self._read_shared(now)
        records = await self._live_records(raw.pop("workers"), local.worker_id)
        views = tuple(
            self._model_view(model, raw["models"][model.name], records, local, now) for model in self._models
        )
        return View(now=now, limits=local.limits, models=views)

    async def _read_shared(self, now: float) -> dict[str, Any]:
        pipe = self._redis.pipeline(transaction=False)
        names = [model.name for model in self._models]
        await self._jobs_waiting.add_to(pipe, names)
        pipe.zrangebyscore(keys.workers_index(), now - keys.WORKER_TTL_S, "+inf")
        for model in self._models:
            pipe.mget([keys.replica_lease(model.name, n) for n in range(_replicas_tracked(model))])
            pipe.get(keys.load_failure(model.name))
            pipe.get(keys.desired_state(model.name))
            for operation in ("load", "wake", "memory"):
                pipe.lrange(keys.measured_costs(model.name, self._kind, operation), 0, -1)
        results = await pipe.execute()
        depths, workers, per_model = decode_depths(names, results[0]), results[1], results[2:]
        models: dict[str, dict[str, Any]] = {}
        fields = ("leases", "failure", "desired", "load", "wake", "memory")
        for index, model in enumerate(self._models):
            values = per_model[index * len(fields) : (index + 1) * len(fields)]
            models[model.name] = dict(zip(fields, values, strict=True))
            models[model.name]["queue"] = depths[model.name]
        return {"models": models, "workers": workers}

    async def holders_elsewhere(self, model: str, own_id: str) -> list[SlotStatus]:
        """The slots other live workers advertise for `model`."""
        since = time.time() - keys.WORKER_TTL_S
        worker_ids = await self._redis.zrangebyscore(keys.workers_index(), since, "+inf")
        records = await self._live_records(cast(list[bytes], worker_ids), own_id)
        return [s for record in records for s in record.slots if s.model == model]

    async def _live_records(self, worker_ids: list[bytes], own_id: str) -> list[WorkerRecord]:
        others = [w for w in worker_ids if w.decode() != own_id]
        if not others:
            return []
        payloads = await self._redis.mget([keys.worker_record(w.decode()) for w in others])
        return [worker_decoder.decode(cast(bytes, p)) for p in payloads if p is not None]

    def _model_view(
        self,
        model: ModelConfig,
        raw: dict[str, Any],
        records: list[WorkerRecord],
        local: LocalFacts,
        now: float,
    ) -> ModelView:
        slot = self._slots[model.name]
        elsewhere = [s for record in records for s in record.slots if s.model == model.name]
        leases: list[bytes | None] = raw["leases"]
        failure = load_failure_decoder.decode(raw["failure"]) if raw["failure"] else None
        desired = desired_state_decoder.decode(raw["desired"]) if raw["desired"] else None
        state = slot.state
        if state == "cold" and model.name in local.starting:
            state = "loading"
        held_here = state != "cold"
        footprint = slot.memory_bytes() if held_here else 0
        if footprint == 0:
            footprint = self._expected_footprint(model, raw["memory"])
        replicas = sum(1 for lease in leases if lease is not None)
        return ModelView(
            name=model.name,
            keep_alive_s=model.keep_alive_s,
            asleep_keep_alive_s=model.asleep_keep_alive_s,
            min_replicas=model.min_replicas,
            max_replicas=model.max_replicas,
            can_sleep=slot.engine is not None and slot.engine.supports_sleep,
            state=state,
            replica=slot.replica,
            in_flight=slot.in_flight,
            load_started=slot.load_started,
            warm_since=slot.warm_since,
            idle_since=slot.idle_since,
            memory_bytes=footprint,
            waiting=raw["queue"].waiting,
            oldest_waiting_s=raw["queue"].oldest_waiting_s(now),
            replicas=replicas,
            loading_replicas=_loading(elsewhere) + (1 if state == "loading" else 0),
            jobs_per_s=sum(s.jobs_per_s for s in elsewhere if s.state == "warm")
            + (slot.jobs_per_s() if state == "warm" else 0.0),
            next_replica=next((n for n, lease in enumerate(leases) if lease is None), None),
            others_with_room=any(_has_room(r, model.name, footprint) for r in records),
            retry_at=_retry_at(failure.retry_at if failure else None, local.backoff_until.get(model.name)),
            load_requested=_load_requested(
                desired, model.name in local.preload_pending, replicas == 0 or state == "sleeping"
            ),
            unload_requested_at=desired.at if desired and desired.action == "unload" else None,
            load_s=typical(raw["load"]),
            wake_s=typical(raw["wake"]),
        )


def _retry_at(shared: float | None, own: float | None) -> float | None:
    """The later of the failure every worker sees and this worker's own backoff."""
    times = [t for t in (shared, own) if t is not None]
    return max(times) if times else None


def _replicas_tracked(model: ModelConfig) -> int:
    return min(model.max_replicas or REPLICAS_TRACKED, REPLICAS_TRACKED)


def _loading(slots: list[SlotStatus]) -> int:
    return sum(1 for s in slots if s.state == "loading")


def _has_room(record: WorkerRecord, model: str, footprint: int) -> bool:
    """Whether that worker may load `model` now without evicting anything."""
    if record.allowed and model not in record.allowed:
        return False
    held = [s for s in record.slots if s.state != "cold"]
    if any(s.state in ("loading", "unloading") for s in held) or any(s.model == model for s in held):
        return False
    if len(held) >= record.max_loaded_models:
        return False
    return record.memory_used_bytes + footprint <= record.memory_budget_bytes


def _load_requested(desired: DesiredState | None, preload_pending: bool, not_serving: bool) -> bool:
    """A preload not yet done, or an operator's load that nobody has carried out yet."""
    operator_load = desired is not None and desired.action == "load"
    return not_serving and (preload_pending or operator_load)
