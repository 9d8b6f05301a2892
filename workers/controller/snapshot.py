"""Read what one decision needs from Redis and from this worker's slots, and shape it as a `View`.

A pass weighs only the models that can matter to it: those with work (the demand index), those
held here, and those the configuration asks for (min_replicas, a preload not yet done), less those
this worker could never hold. What it costs follows what is active, not what is configured:

1. the demand index, then the catalogue version (one round trip; in that order, see
   `switchboard.demand`);
2. the weighed models' queues (one script call per model) and replica leases, and the facts
   (`workers.controller.catalogue`) of those whose facts are not kept at this version;
3. only when a model cold here has demand: the live workers' records (the only decisions that use
   other workers' state are loads of such a model, which prefer a worker whose node has its files);
4. only when a model noted in the index was found without work (no job, no operator's load
   request): its removal.

Job bodies are never read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import msgspec
import redis.asyncio as aioredis

from switchboard import keys, live_workers, lua
from switchboard.config import ModelConfig
from switchboard.demand import DemandIndex
from switchboard.queue_depth import JobsWaiting, QueueDepth, decode_each
from switchboard.wire import DesiredState, SlotStatus, WorkerRecord
from workers.controller.catalogue import Catalogue, ModelFacts
from workers.controller.coordination import typical
from workers.controller.view import ModelView, View, WorkerLimits
from workers.models.adapter_slot import AdapterSlot
from workers.models.files import ModelFiles
from workers.models.slots import Slots

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


@dataclass(frozen=True)
class _Read:
    """What a pass read about one weighed model."""

    queue: QueueDepth
    leases: list[bytes | None]
    facts: ModelFacts


class SnapshotReader:
    """Builds the controller's View of the models one worker weighs now."""

    def __init__(
        self,
        redis: aioredis.Redis,
        models: list[ModelConfig],
        slots: Slots,
        *,
        kind: str,
        memory_budget_bytes: int,
        expected_footprint: Callable[[ModelConfig, list[bytes]], int],
        files: ModelFiles | None = None,
    ) -> None:
        """`files`: where the models' files are (None: every model's path is a local folder)."""
        self._redis = redis
        self._files = files
        # The prefetches seen done on this node (by whichever worker here), per model: the request's
        # time, or 0.0 for one that the configuration asks for (min_replicas, preload). Each is done
        # once: files the cache evicted later are fetched again by a load, not by the prefetch.
        self._prefetched: dict[str, float] = {}
        self._models = models
        self._configured = {model.name: model for model in models}
        self._position = {model.name: position for position, model in enumerate(models)}
        # Weighed on every pass: the configuration keeps replicas of them warm.
        self._kept_warm = {model.name for model in models if model.min_replicas > 0}
        self._slots = slots
        self._memory_budget_bytes = memory_budget_bytes
        self._expected_footprint = expected_footprint
        self._jobs_waiting = JobsWaiting(redis)
        self._scripts = lua.ScriptRunner(redis)
        self._demand = DemandIndex(redis)
        self._catalogue = Catalogue(kind)

    def add(self, model: ModelConfig) -> None:
        """Weigh `model` from the next pass on (an adapter registered at run time)."""
        self._models.append(model)
        self._configured[model.name] = model
        self._position.setdefault(model.name, len(self._position))
        if model.min_replicas > 0:
            self._kept_warm.add(model.name)

    def remove(self, name: str) -> None:
        """Weigh `name` no more (an adapter whose registration was removed), held here or not."""
        model = self._configured.pop(name, None)
        if model is not None:
            self._models.remove(model)
        self._position.pop(name, None)
        self._kept_warm.discard(name)
        self._prefetched.pop(name, None)

    def may_hold(self, model: str) -> bool:
        """Whether this worker could ever hold `model`: it may serve it, and it fits its whole budget
        (or it holds it already)."""
        config = self._configured.get(model)
        if config is None:
            return False
        if config.base is not None:
            return self.may_hold(config.base)  # it takes no memory beyond its base's
        if self._slots[model].state != "cold":
            return True
        facts = self._catalogue.get(model)
        footprint = self._expected_footprint(config, facts.memory if facts is not None else [])
        return footprint <= self._memory_budget_bytes

    async def read(self, local: LocalFacts) -> View:
        """One consistent-enough snapshot of the demand, holders and costs of the models weighed now."""
        now = time.time()
        pipe = self._redis.pipeline(transaction=False)
        self._demand.add_read_to(pipe)
        pipe.get(keys.catalogue_version())
        index_reply, version = await pipe.execute()
        noted = self._demand.decode(index_reply)
        self._catalogue.at_version(version, now)
        weighed = self._weighed(noted, local)
        reads = await self._read_models(weighed)
        records: list[WorkerRecord] = []
        if any(self._cold_with_demand(model, reads[model.name], local, now) for model in weighed):
            records = await live_workers.read_live(self._redis, besides=local.worker_id)
        views = [self._model_view(model, reads[model.name], records, local, now) for model in weighed]
        await self._forget_idle(noted, reads, now)
        return View(now=now, limits=local.limits, models=tuple(with_group_demand(views)))

    def _weighed(self, noted: Mapping[str, bytes], local: LocalFacts) -> list[ModelConfig]:
        """The models this pass looks at: held here, or asked for and possible here."""
        held = self._slots.held_names() | local.starting
        # Only these few names are looked at, never every model configured.
        asked = held | noted.keys() | local.preload_pending | self._kept_warm
        # An adapter's base is weighed with it: the adapter's demand is its base's too.
        bases = {base for name in asked if (base := self._base_of(name)) is not None}
        candidates = sorted(
            (self._configured[name] for name in asked | bases if name in self._configured),
            key=lambda model: self._position[model.name],
        )
        return [model for model in candidates if model.name in held or self.may_hold(model.name)]

    def _base_of(self, name: str) -> str | None:
        config = self._configured.get(name)
        return config.base if config is not None else None

    async def _read_models(self, models: Sequence[ModelConfig]) -> dict[str, _Read]:
        """The queues and leases of `models`, and the facts of those not kept: one round trip."""
        if not models:
            return {}
        names = [model.name for model in models]
        unknown = self._catalogue.missing(names)

        def fill(calls: lua.Calls) -> None:
            self._jobs_waiting.add_each_to(calls, names)
            for model in models:
                calls.pipe.mget([keys.replica_lease(model.name, n) for n in range(_replicas_tracked(model))])
            self._catalogue.add_reads_to(calls.pipe, unknown)

        replies = await self._scripts.run(fill)
        count = len(names)
        queues = decode_each(names, replies[:count])
        leases = replies[count : 2 * count]
        self._catalogue.keep(unknown, replies[2 * count :])
        return {
            name: _Read(queue=queues[name], leases=lease, facts=cast(ModelFacts, self._catalogue.get(name)))
            for name, lease in zip(names, leases, strict=True)
        }

    def _cold_with_demand(self, model: ModelConfig, read: _Read, local: LocalFacts, now: float) -> bool:
        """Whether this pass may weigh loading `model` here, the one decision that needs other workers."""
        if self._slots[model.name].state != "cold" or model.name in local.starting:
            return False
        asked = model.name in local.preload_pending or read.facts.asked(now)
        replicas = sum(1 for lease in read.leases if lease is not None)
        return read.queue.waiting > 0 or asked or replicas < model.min_replicas

    def _prefetch_wanted(self, model: ModelConfig, read: _Read, here: bool, now: float) -> bool:
        """Whether a prefetch of the model's files is asked for and not yet seen done on this node."""
        asked = read.facts.prefetch if read.facts.prefetch_asked(now) else None
        wanted_at = (
            asked.at if asked is not None else (0.0 if model.min_replicas > 0 or model.preload else None)
        )
        if wanted_at is None:
            return False
        if here:
            self._prefetched[model.name] = max(self._prefetched.get(model.name, -1.0), wanted_at)
        return self._prefetched.get(model.name, -1.0) < wanted_at

    async def _forget_idle(self, noted: Mapping[str, bytes], reads: Mapping[str, _Read], now: float) -> None:
        """Remove from the demand index the models read with no job and no operator's load request."""
        idle = [
            (name, token)
            for name, token in noted.items()
            if name in reads and reads[name].queue.length == 0 and not reads[name].facts.asked(now)
        ]
        await self._demand.forget(idle)

    async def holders_elsewhere(self, model: str, own_id: str) -> list[SlotStatus]:
        """The slots other live workers advertise for `model`."""
        records = await live_workers.read_live(self._redis, besides=own_id)
        return [s for record in records for s in record.slots if s.model == model]

    def _model_view(
        self,
        model: ModelConfig,
        read: _Read,
        records: list[WorkerRecord],
        local: LocalFacts,
        now: float,
    ) -> ModelView:
        slot = self._slots[model.name]
        slot.jobs_waiting = read.queue.waiting  # for the heartbeat and the metrics: no read of their own
        elsewhere = [s for record in records for s in record.slots if s.model == model.name]
        leases = read.leases
        failure = read.facts.failure
        desired = read.facts.desired_now(now)
        state = slot.state
        if state == "cold" and model.name in local.starting:
            state = "loading"
        held_here = state != "cold"
        footprint = slot.memory_bytes() if held_here else 0
        if footprint == 0 and model.base is None:
            footprint = self._expected_footprint(model, read.facts.memory)
        replicas = sum(1 for lease in leases if lease is not None)
        files = self._files_view(model, read, records, footprint, now)
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
            batch_in_flight=slot.batch_in_flight,
            load_started=slot.load_started,
            warm_since=slot.warm_since,
            idle_since=slot.idle_since,
            memory_bytes=footprint,
            waiting=read.queue.waiting,
            oldest_waiting_s=read.queue.oldest_waiting_s(now),
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
            load_s=typical(read.facts.load),
            wake_s=typical(read.facts.wake),
            **files,
            **self._adapters_view(model, local.starting),
        )

    def _adapters_view(self, model: ModelConfig, starting: frozenset[str]) -> dict[str, Any]:
        """An adapter's base here and the room its engine has (the adapters whose load began count,
        though their slot is still cold); a base's adapters held here."""
        slot = self._slots[model.name]
        if isinstance(slot, AdapterSlot):
            base = slot.base
            held = sum(1 for adapter in base.adapters if adapter.state != "cold" or adapter.name in starting)
            capacity = base.model.lora.max_adapters if base.model.lora is not None else 0
            return {
                "base": base.name,
                "base_warm_here": base.state == "warm",
                "adapter_room": max(capacity - held, 0),
            }
        if model.lora is not None:
            return {"adapters_here": sum(1 for adapter in slot.adapters if adapter.state != "cold")}
        return {}

    def _files_view(
        self, model: ModelConfig, read: _Read, records: list[WorkerRecord], footprint: int, now: float
    ) -> dict[str, Any]:
        """Where the model's files are, for the view: here or not, the fetch a load here would pay,
        and whether another worker whose node has them has room (a local folder is on every node)."""
        files = self._files
        if files is None or not files.remote(model.name):
            return {}
        total_bytes = typical(read.facts.files)
        here = files.here(model.name)
        return {
            "files_here": here,
            "download_s": files.download_s(model.name, int(total_bytes) if total_bytes else None),
            "fetching_here": files.fetching(model.name),
            "prefetch_wanted": self._prefetch_wanted(model, read, here, now),
            "others_with_files_and_room": any(
                model.name in record.cached and _has_room(record, model.name, footprint) for record in records
            ),
        }


def with_group_demand(views: list[ModelView]) -> list[ModelView]:
    """`views`, each base's demand counting its adapters' (jobs waiting, an operator's load): a base
    is loaded or scaled out for the whole group that runs on it."""
    group: dict[str, list[ModelView]] = {}
    for view in views:
        if view.base is not None and (view.waiting > 0 or view.load_requested):
            group.setdefault(view.base, []).append(view)
    if not group:
        return views
    return [_with_adapters_demand(view, group[view.name]) if view.name in group else view for view in views]


def _with_adapters_demand(base: ModelView, adapters: list[ModelView]) -> ModelView:
    return msgspec.structs.replace(
        base,
        waiting=base.waiting + sum(adapter.waiting for adapter in adapters),
        oldest_waiting_s=max([base.oldest_waiting_s, *(adapter.oldest_waiting_s for adapter in adapters)]),
        load_requested=base.load_requested
        or (base.replicas == 0 and any(a.load_requested for a in adapters)),
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
