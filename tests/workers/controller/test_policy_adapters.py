"""The controller's policy for LoRA adapters: an adapter loads only onto its base warm here, its
demand loads the base first, a full engine evicts the idle sibling cheapest to lose, and a base stays
while adapters are held on it. Hand-built views, no engine, no Redis."""

from __future__ import annotations

from typing import Any

from workers.controller.actions import Load, Unload
from workers.controller.policy import decide
from workers.controller.snapshot import with_group_demand
from workers.controller.view import ModelView, View, WorkerLimits

GIB = 1 << 30
NOW = 1_700_000_000.0
LIMITS = WorkerLimits(
    max_loaded_models=1, memory_budget_bytes=16 * GIB, min_residency_s=20.0, max_pass_over_s=30.0
)


def view(*models: ModelView) -> View:
    """A pass's view as the snapshot shapes it: each base's demand counting its adapters'."""
    return View(now=NOW, limits=LIMITS, models=tuple(with_group_demand(list(models))))


def base(**fields: Any) -> ModelView:
    """The base, warm here and idle for a minute."""
    defaults: dict[str, Any] = {
        "state": "warm",
        "replicas": 1,
        "replica": 0,
        "next_replica": 1,
        "warm_since": NOW - 600,
        "idle_since": NOW - 60,
        "keep_alive_s": 30.0,
        "memory_bytes": 2 * GIB,
        "load_s": 4.0,
    }
    return ModelView(name="base", **{**defaults, **fields})


def adapter(name: str, **fields: Any) -> ModelView:
    """An adapter of `base`, cold everywhere, its base warm here with room for more adapters."""
    defaults: dict[str, Any] = {"base": "base", "base_warm_here": True, "adapter_room": 4, "load_s": 0.1}
    return ModelView(name=name, **{**defaults, **fields})


def test_an_adapter_with_a_job_loads_onto_its_warm_base_without_evicting_the_base() -> None:
    # The worker holds one model at most: the adapter takes no place of its own.
    actions = decide(view(base(), adapter("ft", waiting=1, oldest_waiting_s=0.1)))
    assert actions == [Load(model="ft", replica=0, why=actions[0].why)]


def test_an_adapter_whose_base_is_cold_here_waits_for_the_base() -> None:
    ft = adapter("ft", base_warm_here=False, waiting=1, oldest_waiting_s=0.1)
    assert decide(view(ft)) == []


def test_the_adapters_demand_loads_its_cold_base_once() -> None:
    cold_base = base(state="cold", replicas=0, replica=None, next_replica=0, warm_since=None)
    ft = adapter("ft", base_warm_here=False, waiting=3, oldest_waiting_s=0.2)
    actions = decide(view(cold_base, ft))
    assert [(type(a), a.model) for a in actions] == [(Load, "base")]


def test_a_base_warm_elsewhere_is_not_loaded_again_for_a_short_queue() -> None:
    elsewhere = base(state="cold", replica=None, replicas=1, next_replica=1, jobs_per_s=10.0)
    ft = adapter("ft", base_warm_here=False, waiting=2, oldest_waiting_s=0.1)
    assert decide(view(elsewhere, ft)) == []


def test_a_full_engine_evicts_the_idle_sibling_cheapest_to_lose() -> None:
    warm = {"state": "warm", "replicas": 1, "replica": 0, "warm_since": NOW - 100}
    recent = adapter("recent", **warm, idle_since=NOW - 1, adapter_room=0)
    stale = adapter("stale", **warm, idle_since=NOW - 20, adapter_room=0)
    busy = adapter("busy", **warm, idle_since=NOW - 50, in_flight=1, adapter_room=0)
    new = adapter("new", waiting=1, oldest_waiting_s=0.1, adapter_room=0)
    actions = decide(view(base(adapters_here=3), recent, stale, busy, new))
    assert [(type(a), a.model) for a in actions] == [(Unload, "stale"), (Load, "new")]


def test_a_full_engine_of_busy_adapters_makes_the_new_one_wait() -> None:
    busy = adapter("busy", state="warm", replicas=1, replica=0, in_flight=2, adapter_room=0)
    new = adapter("new", waiting=1, oldest_waiting_s=0.1, adapter_room=0)
    assert decide(view(base(adapters_here=1), busy, new)) == []


def test_a_base_idle_past_its_keep_alive_stays_while_adapters_are_held_on_it() -> None:
    ft = adapter("ft", state="warm", replicas=1, replica=0, idle_since=NOW - 10, keep_alive_s=300.0)
    assert decide(view(base(adapters_here=1), ft)) == []
    assert [type(a) for a in decide(view(base(adapters_here=0)))] == [Unload]


def test_an_adapter_idle_past_its_keep_alive_leaves_before_its_base() -> None:
    ft = adapter("ft", state="warm", replicas=1, replica=0, idle_since=NOW - 400, keep_alive_s=300.0)
    actions = decide(view(base(adapters_here=1), ft))
    assert [(type(a), a.model) for a in actions] == [(Unload, "ft")]


def test_a_busy_adapter_scales_out_only_when_its_queue_outlasts_its_load() -> None:
    held_elsewhere = {"replicas": 1, "next_replica": 1, "jobs_per_s": 2.0, "load_s": 0.5}
    short = adapter("ft", **held_elsewhere, waiting=1, oldest_waiting_s=0.1)
    assert decide(view(base(), short)) == []
    long = adapter("ft", **held_elsewhere, waiting=8, oldest_waiting_s=0.1)
    assert [(type(a), a.model) for a in decide(view(base(), long))] == [(Load, "ft")]


def test_no_adapter_loads_onto_a_base_that_is_leaving() -> None:
    # An operator's unload of the base: its adapter's job waits for the base's next load.
    leaving = base(unload_requested_at=NOW, load_started=NOW - 600)
    assert [(type(a), a.model) for a in decide(view(leaving, adapter("ft", waiting=1)))] == [(Unload, "base")]


def test_group_demand_adds_the_adapters_queues_to_their_base() -> None:
    grouped = with_group_demand(
        [
            base(waiting=1, oldest_waiting_s=0.5),
            adapter("a", waiting=2, oldest_waiting_s=3.0),
            adapter("b", waiting=4, oldest_waiting_s=1.0),
        ]
    )
    assert (grouped[0].waiting, grouped[0].oldest_waiting_s) == (7, 3.0)
    assert [m.waiting for m in grouped[1:]] == [2, 4]


def test_an_adapter_loads_while_a_sibling_loads() -> None:
    # A burst of cold adapters loads one per pass, not one per the end of the last one's load.
    loading = adapter("ft-1", state="loading", replicas=1, replica=0, adapter_room=3)
    actions = decide(view(base(), loading, adapter("ft-2", waiting=1, oldest_waiting_s=0.05, adapter_room=3)))
    assert [(type(a), a.model) for a in actions] == [(Load, "ft-2")]


def test_a_whole_model_waits_for_a_whole_models_transition_but_not_for_an_adapters() -> None:
    roomy = WorkerLimits(
        max_loaded_models=3, memory_budget_bytes=16 * GIB, min_residency_s=20.0, max_pass_over_s=30.0
    )
    other = ModelView(name="other", waiting=1, oldest_waiting_s=1.0, load_s=4.0, memory_bytes=GIB)
    adapter_loading = adapter("ft", state="loading", replicas=1, replica=0)
    actions = decide(View(now=NOW, limits=roomy, models=(base(adapters_here=1), adapter_loading, other)))
    assert [(type(a), a.model) for a in actions] == [(Load, "other")]
    base_unloading = base(state="unloading")
    assert decide(View(now=NOW, limits=roomy, models=(base_unloading, other))) == []
