"""Where each model stands, read from what the workers advertise in Redis.

The front door never calls a worker: a model's replicas come from the live workers' heartbeat
records, its queue from its job stream, its failure from the failure mark, its load times from the
measured costs. `GET /admin/models` shows this; the relay reads it for progress comments and for
the Retry-After of a request whose model is still loading. Nothing here is read on the hot path.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections.abc import Sequence

import msgspec
import redis.asyncio as aioredis

from switchboard import keep_alive, keys, live_workers
from switchboard.adapter_registry import AdapterRegistry
from switchboard.config import ModelConfig
from switchboard.demand import DemandIndex
from switchboard.queue_depth import JobsWaiting, decode_depths
from switchboard.wire import (
    DownloadStatus,
    LoadFailure,
    SlotState,
    SlotStatus,
    WorkerRecord,
    load_failure_decoder,
)

logger = logging.getLogger(__name__)

# A model's state is its best replica's: warm beats loading beats sleeping beats unloading.
_STATE_RANK: dict[SlotState, int] = {"warm": 0, "loading": 1, "sleeping": 2, "unloading": 3, "cold": 4}


class ReplicaStatus(msgspec.Struct, kw_only=True):
    """One model on one worker (one slot of its heartbeat record)."""

    worker_id: str
    host: str
    kind: str
    state: SlotState
    replica: int | None
    in_flight: int
    # Its jobs waiting in the model's stream, as this worker last counted them (`SlotStatus.waiting`).
    waiting: int = 0
    # Seconds since its last job ended (0 while it runs jobs); None while it is not loaded.
    idle_s: float | None
    # Seconds until keep-alive moves it down (warm → sleeping → cold); None: not while busy, or never.
    leaves_in_s: float | None
    # While loading: seconds since the load began, and how long it is expected to take.
    loading_elapsed_s: float | None
    loading_expected_s: float | None
    # While its load fetches the model's files into the worker's node cache: bytes, rate, time left.
    download: DownloadStatus | None = None


class LoadSeconds(msgspec.Struct, kw_only=True):
    """Measured load times of a model on one kind of worker."""

    last: float
    typical: float  # the median of the samples kept
    samples: int


class FailureStatus(msgspec.Struct, kw_only=True):
    """The model's last load failed; no load is tried before `retry_in_s` has passed."""

    reason: str
    worker_id: str
    retry_in_s: float
    failures_in_a_row: int
    # For operators: what failed, where the worker could say it (a fetch of the model's files).
    detail: str = ""


class ModelStatus(msgspec.Struct, kw_only=True):
    """One configured model across every live worker."""

    name: str
    state: SlotState
    replicas: list[ReplicaStatus]
    waiting: int  # jobs on its stream that no worker has taken yet
    in_flight: int
    # Per worker kind, for the kinds of the live workers that have loaded it before.
    load_seconds: dict[str, LoadSeconds]
    idle_s: float | None
    leaves_in_s: float | None
    # Its configuration keeps it where it is (keep-alive -1, or min_replicas > 0).
    never_leaves: bool
    failure: FailureStatus | None = None
    # The hosts of live workers whose node cache holds the (remote) model's files complete.
    cached_on: list[str] = msgspec.field(default_factory=list)
    # A LoRA adapter's base model, whose replicas it loads onto (None for a whole model).
    base: str | None = None
    object: str = "model.status"

    def typical_load_s(self) -> float | None:
        """The shortest typical load time among the kinds measured, if any."""
        return min((cost.typical for cost in self.load_seconds.values()), default=None)

    def load_remaining_s(self) -> float | None:
        """How long until a replica is warm, as far as anyone can tell (None: nothing is known).

        The earliest loading replica's expected end; the typical load time, less what has passed,
        when its expectation is unknown; the typical load time when nothing is loading yet.
        """
        loading = [r for r in self.replicas if r.state == "loading"]
        remaining = [
            r.loading_expected_s - r.loading_elapsed_s
            for r in loading
            if r.loading_expected_s is not None and r.loading_elapsed_s is not None
        ]
        if remaining:
            return min(remaining)
        typical = self.typical_load_s()
        if typical is None:
            return None
        elapsed = max((r.loading_elapsed_s or 0.0 for r in loading), default=0.0)
        return typical - elapsed


class ModelStatusList(msgspec.Struct, kw_only=True):
    """Every configured model (`GET /admin/models`)."""

    data: list[ModelStatus]
    time: float
    object: str = "list"


class ModelStatusReader:
    """Reads model status in three pipelined round trips: queues and failures, records, costs."""

    def __init__(
        self,
        redis: aioredis.Redis,
        models: Sequence[ModelConfig],
        registry: AdapterRegistry | None = None,
    ) -> None:
        self._redis = redis
        self._configured = {m.name: m for m in models}
        # The adapters registered at run time, kept fresh by the registry's own poll.
        self._registry = registry
        self._adapters_seen: dict[str, ModelConfig] = {}
        self._jobs_waiting = JobsWaiting(redis)
        # Progress comments of many requests waiting on one model share one read.
        self._recent: dict[str, tuple[float, asyncio.Task[ModelStatus]]] = {}
        # Every request checks that some live worker may hold its model: they share one read a second.
        self._workers: tuple[float, asyncio.Task[list[WorkerRecord]]] | None = None
        # Metrics scrapes share one read of the queues too.
        self._depths: tuple[float, asyncio.Task[QueueDepths]] | None = None

    def served_on(self, name: str) -> str:
        """The model whose engine serves `name`: an adapter's base, else `name` itself."""
        model = self._model(name)
        return model.base if model is not None and model.base is not None else name

    async def read(self, names: Sequence[str], *, with_costs: bool = True) -> list[ModelStatus]:
        """The status of each of `names` (configured models), in that order."""
        now = time.time()
        pipe = self._redis.pipeline(transaction=False)
        live_workers.add_ids_read_to(pipe, now)
        await self._jobs_waiting.add_to(pipe, names)
        for name in names:
            pipe.get(keys.load_failure(name))
        replies = await pipe.execute()
        worker_ids: list[bytes] = replies[0]
        depths = decode_depths(names, replies[1])
        records = await live_workers.read_records(self._redis, worker_ids)
        costs = await self._load_costs(names, records) if with_costs else {}
        statuses = []
        for name, failure in zip(names, replies[2:], strict=True):
            statuses.append(
                summarize(
                    self._known(name),
                    records,
                    waiting=depths[name].waiting,
                    failure=_decode_failure(failure),
                    load_samples=costs.get(name, {}),
                    now=now,
                )
            )
        return statuses

    async def read_one(self, name: str, *, with_costs: bool = True) -> ModelStatus:
        """The status of one configured model."""
        (status,) = await self.read([name], with_costs=with_costs)
        return status

    async def read_shared(self, name: str, max_age_s: float) -> ModelStatus:
        """The status of `name` without costs, shared with every caller within `max_age_s`."""
        loop = asyncio.get_running_loop()
        recent = self._recent.get(name)
        if recent is None or loop.time() - recent[0] > max_age_s:
            task = loop.create_task(self.read_one(name, with_costs=False))
            recent = self._recent[name] = (loop.time(), task)
        # Shielded: a caller that goes away must not cancel the read the others wait on.
        return await asyncio.shield(recent[1])

    async def live_workers(self, max_age_s: float) -> list[WorkerRecord]:
        """The live workers' records, read at most once per `max_age_s` for every caller."""
        loop = asyncio.get_running_loop()
        if self._workers is None or loop.time() - self._workers[0] > max_age_s:
            self._workers = (loop.time(), loop.create_task(live_workers.read_live(self._redis)))
        # Shielded: a caller that goes away must not cancel the read the others wait on.
        return await asyncio.shield(self._workers[1])

    async def queue_depths(self, max_age_s: float) -> QueueDepths:
        """`queue_depths` of every configured model, read at most once per `max_age_s` for every
        caller: the metrics are open to anyone, and a flood of scrapes must cost Redis nothing more."""
        loop = asyncio.get_running_loop()
        if self._depths is None or loop.time() - self._depths[0] > max_age_s:
            self._depths = (loop.time(), loop.create_task(queue_depths(self._redis, self._names())))
        # Shielded: a caller that goes away must not cancel the read the others wait on.
        return await asyncio.shield(self._depths[1])

    def _model(self, name: str) -> ModelConfig | None:
        registered = self._registry.registered() if self._registry is not None else {}
        model = self._configured.get(name) or registered.get(name)
        if model is not None and model.adapter:
            self._adapters_seen[name] = model
        return model

    def _known(self, name: str) -> ModelConfig:
        """A model named by a request or a listing: still this after its adapter was removed (a
        removal may land between a request's lookup and its status read)."""
        model = self._model(name) or self._adapters_seen.get(name)
        if model is None:
            raise KeyError(name)
        return model

    def _names(self) -> list[str]:
        registered = self._registry.registered() if self._registry is not None else {}
        return [*self._configured, *registered]

    async def _load_costs(
        self, names: Sequence[str], records: list[WorkerRecord]
    ) -> dict[str, dict[str, list[float]]]:
        """Load-time samples (newest first) per model and kind, for the kinds of the live workers."""
        kinds = sorted({record.kind for record in records})
        if not kinds or not names:
            return {}
        pipe = self._redis.pipeline(transaction=False)
        pairs = [(name, kind) for name in names for kind in kinds]
        for name, kind in pairs:
            pipe.lrange(keys.measured_costs(name, kind, "load"), 0, keys.COST_SAMPLES - 1)
        costs: dict[str, dict[str, list[float]]] = {}
        for (name, kind), samples in zip(pairs, await pipe.execute(), strict=True):
            if samples:
                costs.setdefault(name, {})[kind] = [float(s) for s in samples]
        return costs


# Per model: jobs no worker has taken yet, and the age (seconds) of the oldest of them.
QueueDepths = dict[str, tuple[int, float]]


async def queue_depths(redis: aioredis.Redis, models: list[str]) -> QueueDepths:
    """Per model, its queue: the demand index, then one script call for the models with work (every
    other model has none waiting), so a read costs what is active, not what is configured."""
    noted = await DemandIndex(redis).read()
    with_work = [model for model in models if model in noted]
    depths = await JobsWaiting(redis).read(with_work) if with_work else {}
    now = time.time()
    return {
        model: (depths[model].waiting, depths[model].oldest_waiting_s(now)) if model in depths else (0, 0.0)
        for model in models
    }


def may_serve(records: Sequence[WorkerRecord], model: str) -> bool:
    """Whether one of `records` may hold `model` (a worker that lists no models may hold any)."""
    return any(not record.allowed or model in record.allowed for record in records)


def summarize(
    model: ModelConfig,
    records: Sequence[WorkerRecord],
    *,
    waiting: int,
    failure: LoadFailure | None,
    load_samples: dict[str, list[float]],
    now: float,
) -> ModelStatus:
    """One model's status from what was read (pure: tests feed it recorded values)."""
    replicas = sorted(
        (
            _replica(record, slot, now)
            for record in records
            for slot in record.slots
            if slot.model == model.name and slot.state != "cold"
        ),
        key=lambda r: (r.replica is None, r.replica or 0, r.worker_id),
    )
    state: SlotState = min((r.state for r in replicas), key=_STATE_RANK.__getitem__, default="cold")
    held = [r for r in replicas if r.state in ("warm", "sleeping")]
    idle = [r.idle_s for r in held if r.idle_s is not None]
    # The model leaves when its last replica does; one that stays (busy, or for good) keeps it.
    leaves = [r.leaves_in_s for r in held if r.leaves_in_s is not None]
    leaves_in_s = max(leaves) if held and len(leaves) == len(held) else None
    never_leaves = bool(held) and keep_alive.never_leaves(
        state,
        keep_alive_s=model.keep_alive_s,
        asleep_keep_alive_s=model.asleep_keep_alive_s,
        min_replicas=model.min_replicas,
    )
    return ModelStatus(
        name=model.name,
        base=model.base,
        state=state,
        replicas=replicas,
        waiting=waiting,
        in_flight=sum(r.in_flight for r in replicas),
        load_seconds={
            kind: LoadSeconds(last=samples[0], typical=statistics.median(samples), samples=len(samples))
            for kind, samples in sorted(load_samples.items())
            if samples
        },
        idle_s=min(idle) if idle else None,
        leaves_in_s=None if never_leaves else leaves_in_s,
        never_leaves=never_leaves,
        failure=_failure_status(failure, now),
        cached_on=sorted({record.host for record in records if model.name in record.cached}),
    )


def _replica(record: WorkerRecord, slot: SlotStatus, now: float) -> ReplicaStatus:
    loading = slot.state == "loading"
    idle_s: float | None = None
    if slot.state in ("warm", "sleeping"):
        idle_s = 0.0 if slot.in_flight else (max(0.0, now - slot.idle_since) if slot.idle_since else None)
    return ReplicaStatus(
        worker_id=record.id,
        host=record.host,
        kind=record.kind,
        state=slot.state,
        replica=slot.replica,
        in_flight=slot.in_flight,
        waiting=slot.waiting,
        idle_s=idle_s,
        leaves_in_s=None if slot.leaves_at is None else max(0.0, slot.leaves_at - now),
        loading_elapsed_s=max(0.0, now - slot.load_started) if loading and slot.load_started else None,
        loading_expected_s=slot.expected_load_s if loading else None,
        download=slot.download if loading else None,
    )


def _failure_status(failure: LoadFailure | None, now: float) -> FailureStatus | None:
    if failure is None:
        return None
    return FailureStatus(
        reason=failure.reason,
        worker_id=failure.worker_id,
        retry_in_s=max(0.0, failure.retry_at - now),
        failures_in_a_row=failure.failures_in_a_row,
        detail=failure.detail,
    )


def _decode_failure(payload: bytes | None) -> LoadFailure | None:
    if payload is None:
        return None
    try:
        return load_failure_decoder.decode(payload)
    except msgspec.DecodeError:
        logger.warning("unreadable load failure mark", extra={"payload_bytes": len(payload)})
        return None
