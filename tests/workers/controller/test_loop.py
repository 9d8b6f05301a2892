"""workers.controller.loop: the loop against a recording fake of its effects, then whole workers.

The first tests drive `ModelController.step` over a fixed View with a fake `ControllerEffects`: which
effects a pass applies, in what order, and that each committed action is logged once with its why.
The whole-worker tests (real Redis, real Triton, the real controller, scripted engines) check the
coordination between workers (one load per burst, scale-out from measured costs, failures,
keep-alive), which the end-to-end tests then confirm with real vLLM engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

import msgspec
import pytest
import redis
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.catalogue import bump_catalogue
from switchboard.config import ModelConfig
from switchboard.demand import note_demand, poke_demand
from switchboard.local.redis_server import PrivateRedis
from switchboard.metrics import REGISTRY
from switchboard.wire import DesiredState, JobError, encode, load_failure_decoder
from tests.support.jobs import make_job, result, submit
from tests.support.one_worker import KIND, running, settings, until
from tests.support.scripted_engine import Engines
from workers.controller import loop as loop_module
from workers.controller.loop import (
    LOAD_FAILED_REASON,
    MIN_PASS_INTERVAL_S,
    POKE_SETTLE_S,
    Backoff,
    ModelController,
)
from workers.controller.snapshot import LocalFacts
from workers.controller.view import ModelView, View, WorkerLimits
from workers.main import Worker
from workers.models.files import FetchFailed
from workers.models.slot import LoadFailed

NOW = 1_700_000_000.0
LIMITS = WorkerLimits(
    max_loaded_models=1, memory_budget_bytes=1 << 34, min_residency_s=20.0, max_pass_over_s=30.0
)


class RecordingEffects:
    """A ControllerEffects that applies nothing: it records the effects in order and serves one View."""

    def __init__(
        self,
        view: View,
        *,
        failing: dict[str, str] | None = None,
        fetches: dict[str, tuple[float, int]] | None = None,
        failing_fetches: dict[str, str] | None = None,
    ) -> None:
        self.view = view
        self.failing = failing or {}
        # Per remote model: the seconds its load spent on its files, and their bytes.
        self.fetches = fetches or {}
        self.failing_fetches = failing_fetches or {}
        self.costs: dict[tuple[str, str], float] = {}
        self.applied: list[tuple[Any, ...]] = []
        self.taken_elsewhere: set[tuple[str, int]] = set()  # leases another worker holds
        self.ended: dict[str, str] = {}  # warm models whose engine ended, and why

    async def follow_demand(self) -> None:
        pass

    async def wait_for_demand(self, timeout_ms: int) -> list[str]:
        await asyncio.sleep(timeout_ms / 1000)
        return []

    def loads_at_once(self, model: str) -> bool:
        view = next((m for m in self.view.models if m.name == model), None)
        return view is not None and view.base_warm_here and view.state == "cold"

    def may_hold(self, model: str) -> bool:
        return any(m.name == model for m in self.view.models)

    async def poke(self) -> None:
        pass

    async def advertise(self) -> None:
        pass

    async def read_view(self, local: LocalFacts) -> View:
        return self.view

    def is_cold(self, model: str) -> bool:
        return self.view.model(model).state == "cold"

    def engines_ended(self) -> dict[str, str]:
        return dict(self.ended)

    async def serving_elsewhere(self, model: str) -> bool:
        return False

    async def take_lease(self, model: str, replica: int) -> bool:
        self.applied.append(("take_lease", model, replica))
        return (model, replica) not in self.taken_elsewhere

    async def renew_leases(self) -> list[tuple[str, int]]:
        return []

    async def release_lease(self, model: str) -> None:
        self.applied.append(("release_lease", model))

    async def record_cost(self, model: str, operation: str, value: float) -> None:
        self.applied.append(("record_cost", model, operation))
        self.costs[(model, operation)] = value

    async def record_failure(
        self, model: str, reason: str, backoff_s: float, in_a_row: int, detail: str = ""
    ) -> None:
        self.applied.append(
            ("record_failure", model, reason, backoff_s, in_a_row, *([detail] if detail else []))
        )

    async def clear_failure(self, model: str) -> None:
        self.applied.append(("clear_failure", model))

    async def publish_limits(self, model: str) -> None:
        self.applied.append(("publish_limits", model))

    async def consume_load_request(self, model: str) -> None:
        self.applied.append(("consume_load_request", model))

    async def refuse_waiting(self, model: str, error: JobError) -> int:
        self.applied.append(("refuse_waiting", model, error.code))
        return 2

    async def load(self, model: str, expected_s: float | None) -> None:
        self.applied.append(("load", model))
        if model in self.failing_fetches:
            cause = FetchFailed(self.failing_fetches[model])
            raise LoadFailed(str(cause)) from cause
        if model in self.failing:
            raise LoadFailed(self.failing[model])
        await asyncio.sleep(self.fetches.get(model, (0.0, 0))[0])

    def fetched(self, model: str) -> tuple[float, int]:
        return self.fetches.get(model, (0.0, 0))

    async def prefetch(self, model: str) -> None:
        self.applied.append(("prefetch", model))
        if model in self.failing_fetches:
            raise FetchFailed(self.failing_fetches[model])

    def add_model(self, model: ModelConfig) -> bool:
        self.applied.append(("add", model.name))
        return True

    def stop_weighing(self, model: str) -> None:
        self.applied.append(("stop weighing", model))

    def has_slot(self, model: str) -> bool:
        return any(view.name == model for view in self.view.models) and ("forget", model) not in self.applied

    async def forget(self, model: str) -> None:
        self.applied.append(("forget", model))

    async def wake(self, model: str, expected_s: float | None) -> None:
        self.applied.append(("wake", model))

    async def sleep(self, model: str) -> None:
        self.applied.append(("sleep", model))

    async def unload(self, model: str) -> None:
        self.applied.append(("unload", model))

    def memory_bytes(self, model: str) -> int:
        return 1 << 30


def controller(effects: RecordingEffects) -> ModelController:
    """A controller of one worker over `effects`, never started: each test runs its passes."""
    return ModelController(
        effects=effects,
        models=[ModelConfig(name=m.name, path="unused") for m in effects.view.models],
        worker_id="w-1",
        limits=LIMITS,
        backoff=Backoff(2.0, 60.0),
        tick_s=0.1,
    )


async def one_pass(effects: RecordingEffects) -> ModelController:
    """Run one pass and let the transitions it started end."""
    loop = controller(effects)
    await loop.step()
    await loop.stop()
    return loop


def cold(name: str, **fields: Any) -> ModelView:
    return ModelView(name=name, load_s=7.0, **fields)


def warm(name: str, *, idle_for: float, **fields: Any) -> ModelView:
    since = NOW - idle_for
    return ModelView(
        name=name,
        state="warm",
        replica=0,
        replicas=1,
        next_replica=1,
        warm_since=since,
        idle_since=since,
        **fields,
    )


def unloaded(model: str) -> list[tuple[str, ...]]:
    """The effects of one unload, in order."""
    return [("unload", model), ("release_lease", model), ("record_cost", model, "unload")]


def logged_whys(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str]]:
    """The committed actions the loop logged: (action, model, why)."""
    records = [r for r in caplog.records if r.name == "workers.controller.loop" and hasattr(r, "why")]
    return [(r.action, r.model, r.why) for r in records]  # type: ignore[attr-defined]


async def test_a_cold_model_with_waiting_jobs_takes_its_lease_then_loads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "workers.controller")
    effects = RecordingEffects(
        View(now=NOW, limits=LIMITS, models=(cold("tiny", waiting=3, oldest_waiting_s=4.0),))
    )
    await one_pass(effects)
    assert effects.applied == [
        ("take_lease", "tiny", 0),
        ("load", "tiny"),
        ("record_cost", "tiny", "load"),
        ("record_cost", "tiny", "memory"),
        ("publish_limits", "tiny"),
    ]
    assert logged_whys(caplog) == [("load", "tiny", "3 jobs waiting, oldest 4.0 s; nobody holds it")]


class SlowLoads(RecordingEffects):
    """Effects whose loads take `load_s` seconds."""

    def __init__(self, view: View, load_s: float) -> None:
        super().__init__(view)
        self.load_s = load_s

    async def load(self, model: str, expected_s: float | None) -> None:
        await super().load(model, expected_s)
        await asyncio.sleep(self.load_s)


async def test_a_long_load_reports_its_progress_until_it_ends(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, "workers.controller")
    monkeypatch.setattr(loop_module, "PROGRESS_EVERY_S", 0.05)
    effects = SlowLoads(View(now=NOW, limits=LIMITS, models=(cold("tiny", waiting=1),)), load_s=0.18)
    await one_pass(effects)
    reports = [r.getMessage() for r in caplog.records if r.getMessage().startswith("still loading tiny")]
    assert len(reports) >= 2 and reports[0].endswith("of about 7 s")
    await asyncio.sleep(0.15)
    after = [r for r in caplog.records if r.getMessage().startswith("still loading")]
    assert len(after) == len(reports), "none once the load has ended"


async def test_a_load_that_fails_releases_the_lease_and_records_the_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "workers.controller")
    view = View(now=NOW, limits=LIMITS, models=(cold("broken", waiting=2, oldest_waiting_s=1.0),))
    effects = RecordingEffects(view, failing={"broken": "no model files"})
    await one_pass(effects)
    assert effects.applied == [
        ("take_lease", "broken", 0),
        ("load", "broken"),
        ("release_lease", "broken"),
        # Published for every caller to read: the generic reason; the engine's words stay in the log.
        ("record_failure", "broken", LOAD_FAILED_REASON, 2.0, 1),
        ("refuse_waiting", "broken", "load_failed"),
    ]
    assert [why[:2] for why in logged_whys(caplog)] == [("load", "broken")]


async def test_a_load_that_fetched_its_files_records_the_engine_start_apart_from_the_fetch() -> None:
    view = View(
        now=NOW, limits=LIMITS, models=(cold("tuned", waiting=1, oldest_waiting_s=1.0, files_here=False),)
    )
    effects = RecordingEffects(view, fetches={"tuned": (0.2, 5_000_000)})
    await one_pass(effects)
    assert [e for e in effects.applied if e[0] == "record_cost"] == [
        ("record_cost", "tuned", "load"),
        ("record_cost", "tuned", "files"),
        ("record_cost", "tuned", "memory"),
    ]
    assert effects.costs[("tuned", "files")] == 5_000_000
    assert effects.costs[("tuned", "load")] < 0.15, "the fetch's 0.2 s are not the engine's"


async def test_a_failed_fetch_is_a_load_failure_whose_detail_reaches_operators() -> None:
    view = View(
        now=NOW, limits=LIMITS, models=(cold("tuned", waiting=1, oldest_waiting_s=1.0, files_here=False),)
    )
    why = "fetching the files of tuned from s3://models/tuned failed: model.safetensors: md5 mismatch"
    effects = RecordingEffects(view, failing_fetches={"tuned": why})
    await one_pass(effects)
    assert ("record_failure", "tuned", LOAD_FAILED_REASON, 2.0, 1, why) in effects.applied
    assert ("refuse_waiting", "tuned", "load_failed") in effects.applied


async def test_a_prefetch_runs_beside_a_load_and_holds_no_transition() -> None:
    models = (
        cold("wanted", files_here=False, prefetch_wanted=True),
        cold("busy", waiting=1, oldest_waiting_s=1.0),
    )
    effects = RecordingEffects(View(now=NOW, limits=LIMITS, models=models))
    loop = controller(effects)
    await loop.step()
    await asyncio.sleep(0.05)  # a stop cancels the prefetches that still run
    await loop.stop()
    assert ("prefetch", "wanted") in effects.applied and ("load", "busy") in effects.applied
    assert not any(e[0] == "take_lease" and e[1] == "wanted" for e in effects.applied)


async def test_a_failed_prefetch_is_logged_and_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "workers.controller")
    models = (cold("wanted", files_here=False, prefetch_wanted=True),)
    effects = RecordingEffects(
        View(now=NOW, limits=LIMITS, models=models), failing_fetches={"wanted": "no bucket"}
    )
    loop = controller(effects)
    await loop.step()
    await asyncio.sleep(0.05)  # a stop cancels the prefetches that still run
    await loop.stop()
    assert effects.applied == [("prefetch", "wanted")]
    assert any("could not prefetch wanted: no bucket" in r.getMessage() for r in caplog.records)


async def test_a_lease_another_worker_took_loads_nothing_and_evicts_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "workers.controller")
    models = (warm("old", idle_for=100.0, keep_alive_s=3600.0), cold("new", waiting=1, oldest_waiting_s=60.0))
    effects = RecordingEffects(View(now=NOW, limits=LIMITS, models=models))
    effects.taken_elsewhere.add(("new", 0))
    await one_pass(effects)
    assert effects.applied == [("take_lease", "new", 0)]
    assert logged_whys(caplog) == []


async def test_an_eviction_ends_before_the_load_it_makes_room_for(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "workers.controller")
    models = (warm("old", idle_for=100.0, keep_alive_s=3600.0), cold("new", waiting=1, oldest_waiting_s=60.0))
    effects = RecordingEffects(View(now=NOW, limits=LIMITS, models=models))
    await one_pass(effects)
    assert effects.applied == [
        ("take_lease", "new", 0),
        ("unload", "old"),
        ("release_lease", "old"),
        ("record_cost", "old", "unload"),
        ("load", "new"),
        ("record_cost", "new", "load"),
        ("record_cost", "new", "memory"),
        ("publish_limits", "new"),
    ]
    assert [why[:2] for why in logged_whys(caplog)] == [("unload", "old"), ("load", "new")]


async def test_an_idle_model_past_its_keep_alive_unloads(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "workers.controller")
    effects = RecordingEffects(
        View(now=NOW, limits=LIMITS, models=(warm("tiny", idle_for=120.0, keep_alive_s=60.0),))
    )
    await one_pass(effects)
    assert effects.applied == unloaded("tiny")
    ((action, model, why),) = logged_whys(caplog)
    assert (action, model) == ("unload", "tiny") and why


async def test_a_model_whose_engine_ended_unloads_though_busy_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "workers.controller")
    # Just used, well within its keep-alive: only the ended engine unloads it.
    effects = RecordingEffects(
        View(now=NOW, limits=LIMITS, models=(warm("tiny", idle_for=0.0, keep_alive_s=600.0),))
    )
    effects.ended["tiny"] = "the engine core process of tiny ended"
    before = REGISTRY.get_sample_value("switchboard:worker_engines_ended_total", {"model": "tiny"}) or 0.0
    await one_pass(effects)
    assert effects.applied == unloaded("tiny")
    ((action, model, why),) = logged_whys(caplog)
    assert (action, model, why) == ("unload", "tiny", "the engine core process of tiny ended")
    after = REGISTRY.get_sample_value("switchboard:worker_engines_ended_total", {"model": "tiny"})
    assert after == before + 1


async def test_nothing_to_do_applies_no_effect_and_logs_no_action(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "workers.controller")
    models = (warm("busy", idle_for=10.0, keep_alive_s=60.0), cold("unasked"))
    effects = RecordingEffects(View(now=NOW, limits=LIMITS, models=models))
    await one_pass(effects)
    assert effects.applied == []
    assert logged_whys(caplog) == []


async def test_a_removed_adapter_held_here_is_unloaded_then_forgotten_and_may_come_back() -> None:
    effects = RecordingEffects(
        View(now=NOW, limits=LIMITS, models=(warm("ft", idle_for=0.0, keep_alive_s=600.0),))
    )
    loop = controller(effects)
    loop.retire("ft")
    loop.add_model(ModelConfig(name="ft", base="base", path="again"))  # registered anew meanwhile
    await loop.step()
    await loop.stop()
    assert effects.applied == [("stop weighing", "ft"), *unloaded("ft"), ("forget", "ft"), ("add", "ft")]


async def test_a_load_whose_eviction_is_already_under_way_waits_for_the_next_pass() -> None:
    # The view was read while ft-a was leaving for another adapter: taking it as ft-b's room again
    # would overfill the engine.
    full = {"base": "base", "base_warm_here": True, "adapter_room": 0}
    models = (
        warm("base", idle_for=1.0, keep_alive_s=600.0, adapters_here=1, memory_bytes=1),
        warm("ft-a", idle_for=30.0, keep_alive_s=600.0, **full),
        cold("ft-b", waiting=1, oldest_waiting_s=0.1, **full),
    )
    effects = RecordingEffects(View(now=NOW, limits=LIMITS, models=models))
    loop = controller(effects)
    leaving = asyncio.get_running_loop().create_future()
    loop._transitions["ft-a"] = leaving
    await loop.step()
    assert effects.applied == []
    leaving.set_result(None)
    loop._transitions.clear()
    await loop.step()
    await loop.stop()
    assert ("unload", "ft-a") in effects.applied and ("load", "ft-b") in effects.applied


async def test_a_removed_model_without_a_slot_here_changes_nothing() -> None:
    effects = RecordingEffects(View(now=NOW, limits=LIMITS, models=()))
    loop = controller(effects)
    loop.retire("elsewhere")
    await loop.step()
    await loop.stop()
    assert effects.applied == []


class PokedEffects(RecordingEffects):
    """Recording effects whose demand stream carries the given pokes, one at a time, then nothing."""

    def __init__(self, view: View, pokes: list[str]) -> None:
        super().__init__(view)
        self.pokes = pokes
        self.poked = asyncio.Event()
        self.passes = 0
        self.last_pass_at = 0.0

    async def read_view(self, local: LocalFacts) -> View:
        self.passes += 1
        self.last_pass_at = asyncio.get_running_loop().time()
        return self.view

    def poke_about(self, *models: str) -> None:
        self.pokes += models
        self.poked.set()

    async def wait_for_demand(self, timeout_ms: int) -> list[str]:
        if not self.pokes:
            self.poked.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.poked.wait(), timeout_ms / 1000)
        await asyncio.sleep(0.01)
        return [self.pokes.pop(0)] if self.pokes else []


def passes(trigger: str) -> float:
    return REGISTRY.get_sample_value("switchboard:controller_passes_total", {"trigger": trigger}) or 0.0


async def test_only_pokes_about_a_model_this_worker_may_hold_start_a_pass() -> None:
    effects = PokedEffects(
        View(now=NOW, limits=LIMITS, models=(warm("tiny", idle_for=1.0),)), ["elsewhere"] * 20
    )
    loop = ModelController(
        effects=effects, models=[], worker_id="w-1", limits=LIMITS, backoff=Backoff(2.0, 60.0), tick_s=30.0
    )
    pokes_before, ticks_before = passes("poke"), passes("tick")
    await loop.start()
    try:
        await until(lambda: not effects.pokes, 5, "the pokes are read")
        assert effects.passes == 1, "the first pass only"
        effects.poke_about("elsewhere", "tiny")
        await until(lambda: effects.passes == 2, 5, "a pass for the model it holds")
        effects.poke_about("")  # a poke about any model
        await until(lambda: effects.passes == 3, 5, "a pass for any model")
    finally:
        await loop.stop()
    assert (passes("tick") - ticks_before, passes("poke") - pokes_before) == (1, 2)


async def test_a_cold_adapters_poke_ends_the_rest_between_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Under churn, pokes that end transitions set a slow pace between passes; an adapter that loads
    # at once here does not wait it out.
    monkeypatch.setattr(loop_module, "MIN_PASS_INTERVAL_S", 30.0)
    models = (
        warm("base", idle_for=1.0, keep_alive_s=600.0),
        cold("ft", base="base", base_warm_here=True, adapter_room=4),
    )
    effects = PokedEffects(View(now=NOW, limits=LIMITS, models=models), [""])
    loop = ModelController(
        effects=effects, models=[], worker_id="w-1", limits=LIMITS, backoff=Backoff(2.0, 60.0), tick_s=60.0
    )
    await loop.start()
    try:
        await until(
            lambda: effects.passes == 1 and not effects.pokes, 5, "the first pass, then the poke read"
        )
        await asyncio.sleep(0.2)  # resting: the poke's pass is due 30 s after the first
        effects.poke_about("ft")
        await until(lambda: effects.passes == 2, 5, "a pass for the cold adapter, before the 30 s pace")
    finally:
        await loop.stop()


async def test_a_poke_lets_the_job_that_poked_start_before_its_pass() -> None:
    """Long after the last pass, a poke's pass still waits `POKE_SETTLE_S`: the job that poked (which a
    consumer on the same loop takes at once) goes first, then the pass."""
    effects = PokedEffects(View(now=NOW, limits=LIMITS, models=(warm("tiny", idle_for=1.0),)), [])
    loop = ModelController(
        effects=effects, models=[], worker_id="w-1", limits=LIMITS, backoff=Backoff(2.0, 60.0), tick_s=30.0
    )
    await loop.start()
    try:
        await until(lambda: effects.passes == 1, 5, "the first pass")
        await asyncio.sleep(MIN_PASS_INTERVAL_S + 0.05)  # the pass interval is over
        effects.poke_about("tiny")
        poked = asyncio.get_running_loop().time()
        await until(lambda: effects.passes == 2, 5, "the poke's pass")
        waited = effects.last_pass_at - poked
    finally:
        await loop.stop()
    assert waited >= POKE_SETTLE_S, waited


async def test_the_tick_still_passes_without_pokes() -> None:
    effects = PokedEffects(View(now=NOW, limits=LIMITS, models=()), ["elsewhere"] * 100)
    loop = ModelController(
        effects=effects, models=[], worker_id="w-1", limits=LIMITS, backoff=Backoff(2.0, 60.0), tick_s=0.2
    )
    await loop.start()
    try:
        await until(lambda: effects.passes >= 3, 5, "passes on the tick")
    finally:
        await loop.stop()


@pytest.fixture
async def redis_url(redis: aioredis.Redis, redis_server: PrivateRedis) -> str:
    return redis_server.url


# --- whole workers ------------------------------------------------------------------------------


async def test_a_burst_for_a_cold_model_starts_exactly_one_load_across_two_workers(
    redis: aioredis.Redis, redis_url: str
) -> None:
    engines = Engines(start_s=0.5)
    config = settings(redis_url, [ModelConfig(name="tiny", path="unused")])
    async with running(Worker(config, engines), Worker(config, engines)):
        jobs = [make_job("tiny", "fast 3") for _ in range(16)]
        await submit(redis, *jobs)
        results = await asyncio.gather(*(result(redis, j.id) for j in jobs))
        assert all(chunks[-1].finish_reason == "length" for chunks in results)
        assert engines.starts("tiny") == 1
        assert await redis.get(keys.replica_lease("tiny", 0)) is not None
        assert await redis.get(keys.replica_lease("tiny", 1)) is None


async def test_an_idle_model_leaves_after_its_keep_alive_and_loads_again_on_demand(
    redis: aioredis.Redis, redis_url: str
) -> None:
    engines = Engines()
    config = settings(redis_url, [ModelConfig(name="tiny", path="unused", keep_alive_s=1.0)])
    worker = Worker(config, engines)
    async with running(worker):
        first = make_job("tiny", "fast 2")
        await submit(redis, first)
        await result(redis, first.id)
        await until(lambda: engines.stops("tiny") == 1, 10, "the idle model unloads")
        # The engine stops first; Triton unbinds the model after it (in a thread).
        await until(lambda: worker.record().slots == (), 10, "the slot is cold")
        # The replica's lease goes once the unload has finished, just after the slot turned cold.
        deadline = time.monotonic() + 10
        while await redis.get(keys.replica_lease("tiny", 0)) is not None:
            assert time.monotonic() < deadline, "the replica lease was never released"
            await asyncio.sleep(0.05)
        again = make_job("tiny", "fast 2")
        await submit(redis, again)
        assert (await result(redis, again.id))[-1].finish_reason == "length"
        assert engines.starts("tiny") == 2
        assert await redis.llen(keys.measured_costs("tiny", KIND, "load")) == 2


async def test_batch_lines_alone_neither_load_a_model_nor_keep_it_warm(
    redis: aioredis.Redis, redis_url: str
) -> None:
    engines = Engines()
    config = settings(redis_url, [ModelConfig(name="tiny", path="unused", keep_alive_s=1.0)])
    worker = Worker(config, engines)
    async with running(worker):
        line = msgspec.structs.replace(make_job("tiny", "fast 2"), tier="batch")
        await submit(redis, line)
        await asyncio.sleep(1.5)  # several passes of the controller
        assert engines.starts("tiny") == 0, "a batch line alone loaded its model"
        interactive = make_job("tiny", "fast 2")
        await submit(redis, interactive)
        assert (await result(redis, interactive.id))[-1].finish_reason == "length"
        # Warm for the interactive job, the model runs the waiting line in a spare slot.
        assert (await result(redis, line.id))[-1].finish_reason == "length"
        slow_line = msgspec.structs.replace(make_job("tiny", "slow 40 0.1"), tier="batch")
        await submit(redis, slow_line)
        # Four seconds of batch work: the model leaves after its keep-alive all the same.
        await until(lambda: engines.stops("tiny") == 1, 10, "the model unloads under a batch line")


async def test_a_one_model_worker_swaps_between_two_models_and_answers_every_request(
    redis: aioredis.Redis, redis_url: str
) -> None:
    engines = Engines()
    models = [ModelConfig(name=name, path="unused") for name in ("tiny-a", "tiny-b")]
    async with running(Worker(settings(redis_url, models, max_loaded_models=1), engines)):
        for model in ["tiny-a", "tiny-b", "tiny-a", "tiny-b"]:
            one = make_job(model, "fast 2")
            await submit(redis, one)
            assert (await result(redis, one.id))[-1].finish_reason == "length", model
        assert engines.starts("tiny-a") == 2 and engines.starts("tiny-b") == 2
        assert engines.stops("tiny-a") == 2 and engines.stops("tiny-b") == 1


async def operator_request(redis: aioredis.Redis, model: str, action: str) -> None:
    """What `POST /admin/models/{model}/{action}` writes (router.endpoints.admin)."""
    pipe = redis.pipeline(transaction=False)
    desired = DesiredState(action=action, at=time.time())  # type: ignore[arg-type]
    pipe.set(keys.desired_state(model), encode(desired), ex=keys.DESIRED_TTL_S)
    bump_catalogue(pipe)
    if action == "load":
        note_demand(pipe, model, uuid.uuid4().hex)
    else:
        poke_demand(pipe, model)
    await pipe.execute()


async def test_an_operator_loads_a_model_nobody_asked_for_among_many_then_unloads_it(
    redis: aioredis.Redis, redis_url: str
) -> None:
    engines = Engines()
    models = [ModelConfig(name=f"m{n}", path="unused") for n in range(200)]
    async with running(Worker(settings(redis_url, models), engines)):
        await asyncio.sleep(0.5)  # a few idle passes first
        await operator_request(redis, "m123", "load")
        await until(lambda: engines.starts("m123") == 1, 10, "the model loads with no job waiting")
        await until(lambda: not redis_sync_exists(redis_url, keys.desired_state("m123")), 10, "request done")
        await operator_request(redis, "m123", "unload")
        await until(lambda: engines.stops("m123") == 1, 10, "the model unloads")
        await until(lambda: not redis_sync_hlen(redis_url, keys.demand_index()), 10, "nothing left noted")
        assert sum(engines.starts(model.name) for model in models) == 1


def redis_sync_exists(url: str, key: str) -> bool:
    with redis.Redis.from_url(url) as client:
        return bool(client.exists(key))


def redis_sync_hlen(url: str, key: str) -> int:
    with redis.Redis.from_url(url) as client:
        return int(client.hlen(key))  # type: ignore[arg-type]


@pytest.mark.parametrize(("measured_load_s", "second_replica"), [(0.2, True), (1000.0, False)])
async def test_a_backlog_adds_a_replica_only_when_waiting_would_cost_more_than_loading(
    redis: aioredis.Redis, redis_url: str, measured_load_s: float, second_replica: bool
) -> None:
    # Timings under the test's control: the load time this kind of worker "measured" before.
    for _ in range(3):
        await redis.lpush(keys.measured_costs("tiny", KIND, "load"), measured_load_s)
    engines = Engines()
    config = settings(
        redis_url, [ModelConfig(name="tiny", path="unused", preload=True)], max_concurrent_jobs=2
    )
    async with running(Worker(config, engines), Worker(config, engines)):
        await until(lambda: engines.starts("tiny") == 1, 15, "one worker preloads the model")
        await asyncio.sleep(1.0)  # both controllers have seen the replica
        # 24 jobs of about half a second, two at a time: about 6 s of queue for one replica.
        jobs = [make_job("tiny", "slow 10 0.05") for _ in range(24)]
        await submit(redis, *jobs)
        results = await asyncio.gather(*(result(redis, j.id, timeout_s=60) for j in jobs))
        assert all(chunks[-1].finish_reason == "length" for chunks in results)
        assert engines.starts("tiny") == (2 if second_replica else 1)


async def test_a_failed_load_answers_the_waiting_requests_and_backs_off(
    redis: aioredis.Redis, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    engines = Engines(fail={"broken": "no model files in /models/broken"})
    # 3 s: the check that no load starts within the backoff, 1 s after the answers are read, still
    # holds after a second-long stall on a loaded machine.
    config = settings(redis_url, [ModelConfig(name="broken", path="unused")], load_backoff_s=3.0)
    async with running(Worker(config, engines)):
        jobs = [make_job("broken", "fast 1") for _ in range(3)]
        await submit(redis, *jobs)
        for one in jobs:
            (chunk,) = await result(redis, one.id)
            assert chunk.error is not None and chunk.error.code == "load_failed"
            # The model's path is in the worker's log, never in what reaches callers.
            assert chunk.error.message == LOAD_FAILED_REASON
            assert chunk.error.retry_after_s == 3.0
        failure = load_failure_decoder.decode(await redis.get(keys.load_failure("broken")))
        assert failure.reason == LOAD_FAILED_REASON
        assert any("no model files in /models/broken" in record.getMessage() for record in caplog.records)
        assert 0 < await redis.pttl(keys.load_failure("broken")) <= 3000
        late = make_job("broken", "fast 1")
        await submit(redis, late)
        await asyncio.sleep(1.0)
        assert engines.starts("broken") == 1, "no new attempt during the backoff"
        (chunk,) = await result(redis, late.id)  # the retry after the backoff fails again
        assert chunk.error is not None and chunk.error.code == "load_failed"
        assert chunk.error.retry_after_s == 6.0, "the backoff doubles"
        assert engines.starts("broken") == 2


async def test_a_job_whose_deadline_passes_during_the_load_never_runs(
    redis: aioredis.Redis, redis_url: str
) -> None:
    engines = Engines(start_s=2.0)
    config = settings(redis_url, [ModelConfig(name="slow-load", path="unused")])
    async with running(Worker(config, engines)):
        hurried = make_job("slow-load", "fast 2", deadline_s=0.5)
        patient = make_job("slow-load", "fast 2")
        await submit(redis, hurried, patient)
        (expired,) = await result(redis, hurried.id)
        assert expired.error is not None and expired.error.code == "timeout"
        assert (await result(redis, patient.id))[-1].finish_reason == "length"
        (engine,) = [e for e in engines.made["slow-load"] if e.starts]  # others only estimated memory
        assert engine.requests == [patient.id]
