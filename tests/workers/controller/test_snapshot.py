"""workers.controller.snapshot against a real Redis: a pass reads what is active, not what is configured.

The slots are plain stand-ins (a state and the numbers the view takes from a slot); Redis is real,
and each test counts the commands a pass sends with INFO commandstats.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.catalogue import bump_catalogue
from switchboard.config import ModelConfig
from switchboard.demand import DemandIndex, note_demand
from switchboard.wire import DesiredState, SlotStatus, WorkerRecord, encode
from workers.controller import catalogue
from workers.controller.coordination import Coordination
from workers.controller.snapshot import LocalFacts, SnapshotReader
from workers.controller.view import WorkerLimits

GIB = 1024**3
KIND = "scripted"
LIMITS = WorkerLimits(
    max_loaded_models=2, memory_budget_bytes=8 * GIB, min_residency_s=10, max_pass_over_s=30
)


@dataclass
class Slot:
    """What the snapshot reads of a model slot."""

    state: str = "cold"
    replica: int | None = None
    in_flight: int = 0
    batch_in_flight: int = 0
    load_started: float | None = None
    warm_since: float | None = None
    idle_since: float | None = None
    engine: None = None
    jobs_waiting: int = 0

    def memory_bytes(self) -> int:
        return GIB if self.state != "cold" else 0

    def jobs_per_s(self) -> float:
        return 0.0


class FakeSlots(dict[str, Slot]):
    """What the snapshot reads of the worker's slots: each by name, and the names of those held."""

    def held_names(self) -> set[str]:
        return {name for name, slot in self.items() if slot.state != "cold"}


def reader(redis: aioredis.Redis, models: Sequence[ModelConfig], held: Sequence[str] = ()) -> SnapshotReader:
    slots = FakeSlots({model.name: Slot(state="warm" if model.name in held else "cold") for model in models})
    return SnapshotReader(
        redis,
        list(models),
        slots,  # type: ignore[arg-type]
        kind=KIND,
        memory_budget_bytes=LIMITS.memory_budget_bytes,
        expected_footprint=lambda model, measured: int((model.footprint_gib or 0) * GIB),
    )


def local(preload_pending: Sequence[str] = ()) -> LocalFacts:
    return LocalFacts(
        worker_id="w-1",
        limits=LIMITS,
        starting=frozenset(),
        preload_pending=frozenset(preload_pending),
        backoff_until={},
    )


def configured(count: int, **fields: object) -> list[ModelConfig]:
    return [ModelConfig(name=f"m{n}", path="unused", **fields) for n in range(count)]  # type: ignore[arg-type]


async def enqueue(redis: aioredis.Redis, model: str, token: str = "job-1") -> None:
    """A job on `model`'s stream, noted as an enqueue notes it."""
    pipe = redis.pipeline(transaction=False)
    pipe.xadd(keys.job_stream(model), {keys.JOB_FIELD: b"x"})
    note_demand(pipe, model, token)
    await pipe.execute()


async def calls(redis: aioredis.Redis) -> dict[str, int]:
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


async def commands_of(redis: aioredis.Redis, snapshot: SnapshotReader, facts: LocalFacts) -> dict[str, int]:
    """The commands one pass sends (by name)."""
    before = await calls(redis)
    await snapshot.read(facts)
    after = await calls(redis)
    sent = {name: after[name] - before.get(name, 0) for name in after if name != "info"}
    return {name: count for name, count in sent.items() if count}


async def test_a_pass_weighs_the_models_with_work_held_here_or_asked_for_and_no_other(
    redis: aioredis.Redis,
) -> None:
    models = [*configured(40), ModelConfig(name="kept", path="unused", min_replicas=1)]
    models.append(ModelConfig(name="preloaded", path="unused", preload=True))
    await enqueue(redis, "m3")
    await enqueue(redis, "not-configured-here")
    view = await reader(redis, models, held=["m7"]).read(local(preload_pending=["preloaded"]))
    assert [model.name for model in view.models] == ["m3", "m7", "kept", "preloaded"]
    assert view.model("m3").waiting == 1
    assert view.model("m7").state == "warm"


async def test_a_pass_leaves_each_held_models_waiting_jobs_on_its_slot(redis: aioredis.Redis) -> None:
    """The heartbeat and the metrics show them from there, without a read of their own."""
    snapshot = reader(redis, configured(2), held=["m0", "m1"])
    await enqueue(redis, "m0", "job-1")
    await enqueue(redis, "m0", "job-2")
    await snapshot.read(local())
    slots = snapshot._slots
    assert (slots["m0"].jobs_waiting, slots["m1"].jobs_waiting) == (2, 0)


@pytest.mark.parametrize("count", [1, 1000])
async def test_an_idle_pass_costs_two_commands_whatever_the_catalogue(
    redis: aioredis.Redis, count: int
) -> None:
    snapshot = reader(redis, configured(count))
    await snapshot.read(local())
    assert await commands_of(redis, snapshot, local()) == {"hgetall": 1, "get": 1}


async def test_a_held_models_pass_costs_the_same_whatever_the_catalogue(redis: aioredis.Redis) -> None:
    sent = []
    for count in (1, 1000):
        snapshot = reader(redis, configured(count), held=["m0"])
        await snapshot.read(local())  # the first pass also reads m0's facts
        sent.append(await commands_of(redis, snapshot, local()))
    assert sent[0] == sent[1]
    assert sum(sent[0].values()) <= 8, sent[0]
    assert "lrange" not in sent[0], "the facts are kept while the catalogue version stands"


async def test_facts_are_read_again_when_the_version_moves_or_after_the_refresh(
    redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = reader(redis, configured(3), held=["m1"])
    assert (await snapshot.read(local())).model("m1").load_s is None
    await Coordination(redis, "w-2", KIND).record_cost("m1", "load", 4.0)  # bumps the version
    assert (await snapshot.read(local())).model("m1").load_s == 4.0
    # A change that bumps nothing (an expiry) is seen after the refresh interval.
    await redis.lpush(keys.measured_costs("m1", KIND, "load"), "8", "8")
    assert (await snapshot.read(local())).model("m1").load_s == 4.0
    monkeypatch.setattr(catalogue, "REFRESH_S", 0.0)
    assert (await snapshot.read(local())).model("m1").load_s == 8.0


async def test_a_model_found_without_work_leaves_the_demand_index(redis: aioredis.Redis) -> None:
    models = configured(3)
    await enqueue(redis, "m0", token="a")
    await enqueue(redis, "m1", token="b")
    await redis.delete(keys.job_stream("m1"))  # its job ended: acknowledged and deleted
    snapshot = reader(redis, models)
    view = await snapshot.read(local())
    assert [model.name for model in view.models] == ["m0", "m1"]
    assert await DemandIndex(redis).read() == {"m0": b"a"}
    assert [model.name for model in (await snapshot.read(local())).models] == ["m0"]


async def test_a_job_taken_but_not_finished_keeps_its_model_in_the_index(redis: aioredis.Redis) -> None:
    await enqueue(redis, "m0")
    await redis.xgroup_create(keys.job_stream("m0"), keys.JOB_GROUP, id="0")
    await redis.xreadgroup(keys.JOB_GROUP, "a-worker-that-may-die", {keys.job_stream("m0"): ">"})
    view = await reader(redis, configured(2)).read(local())
    assert view.model("m0").waiting == 0
    assert await DemandIndex(redis).read() == {"m0": b"job-1"}, "a takeover sweep must still find it"


async def operator_request(redis: aioredis.Redis, model: str, action: str, at: float) -> None:
    """What `POST /admin/models/{model}/{action}` writes."""
    pipe = redis.pipeline(transaction=False)
    pipe.set(keys.desired_state(model), encode(DesiredState(action=action, at=at)), ex=keys.DESIRED_TTL_S)  # type: ignore[arg-type]
    bump_catalogue(pipe)
    if action == "load":
        note_demand(pipe, model, f"operator-{at}")
    await pipe.execute()


async def test_an_operators_load_request_keeps_its_model_weighed_until_it_is_done_or_expires(
    redis: aioredis.Redis,
) -> None:
    snapshot = reader(redis, configured(5), held=["m1"])
    await snapshot.read(local())
    await operator_request(redis, "m2", "load", at=time.time())
    view = await snapshot.read(local())
    assert [model.name for model in view.models] == ["m1", "m2"]
    assert view.model("m2").load_requested
    assert "m2" in await DemandIndex(redis).read(), "no job, but the request keeps it noted"
    await redis.delete(keys.desired_state("m2"))  # carried out: consumed, and the version bumped
    pipe = redis.pipeline(transaction=False)
    bump_catalogue(pipe)
    await pipe.execute()
    await snapshot.read(local())
    assert await DemandIndex(redis).read() == {}
    # A request whose key has expired (which bumps nothing) no longer counts.
    await operator_request(redis, "m3", "load", at=time.time() - keys.DESIRED_TTL_S - 1)
    assert [model.name for model in (await snapshot.read(local())).models] == ["m1", "m3"]
    assert await DemandIndex(redis).read() == {}


async def test_an_operators_unload_request_reaches_the_holder_without_a_note(redis: aioredis.Redis) -> None:
    snapshot = reader(redis, configured(5), held=["m1"])
    assert (await snapshot.read(local())).model("m1").unload_requested_at is None
    at = time.time()
    await operator_request(redis, "m1", "unload", at=at)
    view = await snapshot.read(local())
    assert [model.name for model in view.models] == ["m1"]
    assert view.model("m1").unload_requested_at == at


async def test_a_model_this_worker_could_never_hold_is_not_weighed(redis: aioredis.Redis) -> None:
    models = [ModelConfig(name="huge", path="unused", footprint_gib=80), *configured(1)]
    await enqueue(redis, "huge")
    snapshot = reader(redis, models)
    assert not snapshot.may_hold("huge") and not snapshot.may_hold("unknown") and snapshot.may_hold("m0")
    assert (await snapshot.read(local())).models == ()
    assert "huge" in await DemandIndex(redis).read(), "left for the workers that may hold it"
    assert reader(redis, models, held=["huge"]).may_hold("huge"), "what it holds, it may hold"


async def test_other_workers_are_read_only_when_a_model_cold_here_has_demand(redis: aioredis.Redis) -> None:
    other = WorkerRecord(
        id="w-2",
        host="h",
        pid=1,
        started=0.0,
        heartbeat=time.time(),
        models=("m0",),
        triton_http_port=0,
        triton_grpc_port=0,
        triton_metrics_port=0,
        kind=KIND,
        max_loaded_models=2,
        memory_budget_bytes=8 * GIB,
        slots=(SlotStatus(model="m0", state="warm", replica=0, jobs_per_s=2.5),),
    )
    await redis.set(keys.worker_record(other.id), encode(other))
    await redis.zadd(keys.workers_index(), {other.id: time.time()})
    snapshot = reader(redis, configured(3), held=["m0"])
    await snapshot.read(local())
    assert "zrangebyscore" not in await commands_of(redis, snapshot, local())
    await enqueue(redis, "m1")
    sent = await commands_of(redis, snapshot, local())
    assert sent["zrangebyscore"] == 1 and sent["mget"] >= 1
    view = await snapshot.read(local())
    assert view.model("m1").others_with_room


@dataclass
class Files:
    """What the snapshot reads of where the models' files are (remote models, the node cache)."""

    remote_models: set[str]
    cached: set[str]
    rate_bps: float | None = None
    fetching_now: set[str] = field(default_factory=set)

    def remote(self, name: str) -> bool:
        return name in self.remote_models

    def here(self, name: str) -> bool:
        return name not in self.remote_models or name in self.cached

    def fetching(self, name: str) -> bool:
        return name in self.fetching_now

    def download_s(self, name: str, total_bytes: int | None) -> float | None:
        if self.here(name):
            return 0.0
        return total_bytes / self.rate_bps if total_bytes and self.rate_bps else None


def files_reader(redis: aioredis.Redis, models: Sequence[ModelConfig], files: Files) -> SnapshotReader:
    snapshot = reader(redis, models)
    snapshot._files = files  # type: ignore[assignment]
    return snapshot


def record_of(worker_id: str, *, cached: tuple[str, ...], **fields: object) -> WorkerRecord:
    return WorkerRecord(
        id=worker_id, host="h", pid=1, started=0.0, heartbeat=time.time(), models=(), triton_http_port=0,
        triton_grpc_port=0, triton_metrics_port=0, kind=KIND, max_loaded_models=2,
        memory_budget_bytes=8 * GIB, cached=cached, **fields,  # type: ignore[arg-type]
    )  # fmt: skip


async def advertise(redis: aioredis.Redis, record: WorkerRecord) -> None:
    await redis.set(keys.worker_record(record.id), encode(record))
    await redis.zadd(keys.workers_index(), {record.id: time.time()})


async def test_a_remote_models_view_weighs_its_files_here_its_fetch_and_the_workers_that_have_them(
    redis: aioredis.Redis,
) -> None:
    models = configured(2, footprint_gib=1)
    files = Files(remote_models={"m0", "m1"}, cached={"m1"}, rate_bps=50e6)
    await Coordination(redis, "w-9", KIND).record_cost("m0", "files", 500e6)
    await advertise(redis, record_of("w-2", cached=("m0",)))
    await enqueue(redis, "m0")
    await enqueue(redis, "m1", token="job-2")
    view = await files_reader(redis, models, files).read(local())
    far, near = view.model("m0"), view.model("m1")
    assert (far.files_here, far.download_s, far.others_with_files_and_room) == (False, 10.0, True)
    assert (near.files_here, near.download_s, near.others_with_files_and_room) == (True, 0.0, False)
    full = record_of("w-3", cached=("m1",), memory_used_bytes=8 * GIB)
    await advertise(redis, full)
    assert not (await files_reader(redis, models, files).read(local())).model("m1").others_with_files_and_room


async def test_a_prefetch_is_wanted_until_this_node_has_the_files_once(redis: aioredis.Redis) -> None:
    models = configured(2)
    files = Files(remote_models={"m0", "m1"}, cached=set())
    snapshot = files_reader(redis, models, files)
    await operator_request(redis, "m0", "load", at=time.time())  # a load request is no prefetch
    prefetch = DesiredState(action="prefetch", at=time.time())
    pipe = redis.pipeline(transaction=False)
    pipe.set(keys.prefetch_request("m1"), encode(prefetch), ex=keys.PREFETCH_TTL_S)
    note_demand(pipe, "m1", "prefetch")
    bump_catalogue(pipe)
    await pipe.execute()
    view = await snapshot.read(local())
    assert not view.model("m0").prefetch_wanted and view.model("m1").prefetch_wanted
    assert "m1" in await DemandIndex(redis).read(), "the request keeps it weighed"
    files.cached.add("m1")  # fetched on this node (by this worker or another of the host)
    assert not (await snapshot.read(local())).model("m1").prefetch_wanted
    files.cached.clear()  # evicted since: the next load fetches it, not the prefetch again
    assert not (await snapshot.read(local())).model("m1").prefetch_wanted
    kept = ModelConfig(name="kept", path="unused", min_replicas=1)
    cold_kept = files_reader(redis, [kept], Files(remote_models={"kept"}, cached=set()))
    assert (await cold_kept.read(local())).model("kept").prefetch_wanted, "min_replicas wants its files here"
