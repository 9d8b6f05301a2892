"""The controller's policy for remote models: the fetch of their files weighs in placement and
scale-out, and prefetches fill node caches ahead of loads. Hand-built views, no engine, no Redis."""

from __future__ import annotations

from typing import Any

from workers.controller.actions import Load, Prefetch
from workers.controller.policy import OTHERS_FIRST_GRACE_S, decide
from workers.controller.view import ModelView, View, WorkerLimits

GIB = 1 << 30
NOW = 1_700_000_000.0
LIMITS = WorkerLimits(
    max_loaded_models=2, memory_budget_bytes=16 * GIB, min_residency_s=20.0, max_pass_over_s=30.0
)
LOAD_S = 7.1


def view(*models: ModelView) -> View:
    return View(now=NOW, limits=LIMITS, models=models)


def remote(name: str, **fields: Any) -> ModelView:
    """A remote model nobody holds, whose files this node's cache lacks."""
    return ModelView(name=name, **{"load_s": LOAD_S, "files_here": False, "download_s": 40.0, **fields})


def test_a_cold_model_waits_for_a_free_worker_whose_node_has_its_files() -> None:
    model = remote("tuned", waiting=1, oldest_waiting_s=0.5, others_with_files_and_room=True)
    assert decide(view(model)) == []


def test_that_wait_is_bounded_by_the_grace_then_this_worker_fetches() -> None:
    model = remote(
        "tuned", waiting=1, oldest_waiting_s=OTHERS_FIRST_GRACE_S + 0.1, others_with_files_and_room=True
    )
    assert [type(a) for a in decide(view(model))] == [Load]


def test_a_fetch_quicker_than_the_wait_is_made_here_at_once() -> None:
    model = remote("tuned", waiting=1, oldest_waiting_s=0.5, download_s=0.2, others_with_files_and_room=True)
    assert [type(a) for a in decide(view(model))] == [Load]


def test_an_unmeasured_fetch_still_prefers_the_worker_with_the_files() -> None:
    model = remote("tuned", waiting=1, oldest_waiting_s=0.5, download_s=None, others_with_files_and_room=True)
    assert decide(view(model)) == []


def test_a_worker_whose_node_has_the_files_loads_at_once() -> None:
    model = remote("tuned", waiting=1, oldest_waiting_s=0.1, files_here=True, download_s=0.0,
                   others_with_files_and_room=True)  # fmt: skip
    assert [type(a) for a in decide(view(model))] == [Load]


def test_without_a_worker_that_has_the_files_the_first_free_one_fetches() -> None:
    model = remote("tuned", waiting=1, oldest_waiting_s=0.1, others_with_room=True)
    assert [type(a) for a in decide(view(model))] == [Load]


def _serving(**fields: Any) -> ModelView:
    """One replica warm elsewhere, its queue draining at 1 job/s."""
    base = {"replicas": 1, "next_replica": 1, "jobs_per_s": 1.0}
    return remote("tuned", **{**base, **fields})


def test_scale_out_weighs_the_fetch_with_the_load() -> None:
    # 30 s of queue: more than the engine's 7.1 s start, less than that plus a 40 s fetch.
    assert decide(view(_serving(waiting=30, download_s=40.0))) == []
    actions = decide(view(_serving(waiting=60, download_s=40.0)))
    assert [type(a) for a in actions] == [Load]
    assert "fetch 40 s" in actions[0].why


def test_a_node_with_the_files_scales_out_on_the_load_alone() -> None:
    actions = decide(view(_serving(waiting=30, files_here=True, download_s=0.0)))
    assert [type(a) for a in actions] == [Load]


def test_a_wanted_model_is_prefetched_once_beside_a_load() -> None:
    wanted = remote("tuned", prefetch_wanted=True)
    busy = ModelView(name="base", load_s=LOAD_S, waiting=2, oldest_waiting_s=1.0)
    actions = decide(view(wanted, busy))
    assert actions[0] == Prefetch(model="tuned", why="fetch its files into this node's cache ahead of a load")
    assert [type(a) for a in actions] == [Prefetch, Load]


def test_no_prefetch_while_one_runs_or_when_the_files_are_here() -> None:
    assert (
        decide(view(remote("a", prefetch_wanted=True, fetching_here=True), remote("b", prefetch_wanted=True)))
        == []
    )
    assert decide(view(remote("a", prefetch_wanted=True, files_here=True))) == []
    assert decide(view(remote("a", prefetch_wanted=False))) == []
