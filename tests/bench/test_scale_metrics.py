"""The scale benchmark's figures (`bench/scale_metrics.py`) from recorded actions, loads and requests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scale_load import Sent
from scale_metrics import (
    INFINITY,
    Holding,
    cold_waits,
    contended,
    holdings,
    load_storms,
    pass_stats,
    request_stats,
    saturated,
)


def record(
    actions: Sequence[tuple[str, str, str, float]] = (),
    loads: Sequence[tuple[str, str, float, float | None]] = (),
    stops: Sequence[tuple[str, str, float]] = (),
    passes: Sequence[tuple[float, float]] = (),
) -> dict[str, Any]:
    """One fleet's records, as `scale_fleet` writes them."""
    return {
        "actions": list(actions),
        "loads": list(loads),
        "stops": list(stops),
        "passes": list(passes),
        "cpu_s": 0,
    }


def sent(model: str, at: float, status: int | None = 200, error: str | None = None) -> Sent:
    return Sent(model=model, sent_at=at, seconds=0.1, status=status, error=error)


def test_a_model_is_held_from_its_load_action_to_its_unload_action_and_warm_when_its_engine_is() -> None:
    held = holdings(
        [
            record(
                actions=[("w1", "load", "m", 10.0), ("w1", "unload", "m", 20.0), ("w1", "load", "m", 30.0)],
                loads=[("w1", "m", 10.5, 11.0), ("w1", "m", 30.2, None)],
                stops=[("w1", "m", 20.5)],
            )
        ]
    )
    assert held == {
        "m": [Holding("w1", 10.0, 20.0, 11.0), Holding("w1", 30.0, INFINITY, INFINITY)],
    }


def test_without_the_controllers_actions_the_engines_loads_and_stops_mark_what_is_held() -> None:
    held = holdings([record(loads=[("w1", "m", 10.0, 11.0)], stops=[("w1", "m", 20.0)])])
    assert held == {"m": [Holding("w1", 10.0, 20.0, 11.0)]}


def test_the_first_request_of_each_cold_period_waits_for_the_load_that_answers_it() -> None:
    held = {"m": [Holding("w1", 6.0, 20.0, 7.0), Holding("w2", 31.0, INFINITY, 32.0)]}
    requests = [
        sent("m", 5.0),  # cold: the load at 6 answers it
        sent("m", 5.5),  # the same cold period
        sent("m", 12.0),  # held
        sent("m", 30.0),  # cold again: the load at 31
        sent("n", 1.0),  # nobody ever loads n
    ]
    waits, never = cold_waits(requests, held)
    assert sorted(waits) == [1.0, 1.0]
    assert never == 1


def test_a_load_that_starts_while_another_worker_still_loads_the_model_is_a_storm() -> None:
    held = {
        "m": [
            Holding("w1", 10.0, INFINITY, 10.8),
            Holding("w2", 10.3, INFINITY, 11.0),  # w1 is still loading: a storm
            Holding("w3", 12.0, INFINITY, 12.5),  # both are warm: an added replica
        ],
        "n": [Holding("w1", 1.0, 2.0, 1.5), Holding("w2", 3.0, INFINITY, 3.5)],  # one after the other
    }
    storms, replicas = load_storms(held)
    assert storms == [{"model": "m", "at": 10.3, "after_s": 0.3}]
    assert replicas == 1


def test_passes_are_counted_and_timed_within_their_phase() -> None:
    records = [record(passes=[(1.0, 0.010), (2.0, 0.020), (3.0, 0.030)]), record(passes=[(2.5, 0.040)])]
    stats = pass_stats(records, 2.0, 3.0)
    assert stats["passes"] == 2
    assert stats["passes_per_s"] == 2.0
    assert stats["pass_p50_ms"] == 30.0


def test_requests_are_told_apart_as_answered_failed_and_unfinished() -> None:
    requests = [
        sent("m", 1.0),
        sent("m", 1.1, status=503, error="no worker"),
        sent("m", 1.2, status=None, error="unfinished when the phase ended"),
    ]
    stats = request_stats(requests, seconds=2.0)
    assert (stats["requests"], stats["ok"], stats["failed"], stats["unfinished"]) == (3, 1, 1, 1)
    assert stats["ok_per_s"] == 0.5


def point(workers_cpu: float, processes: int, pass_ms: float, machine_cpu: float = 1.0) -> dict[str, Any]:
    process_cpu = {"workers": workers_cpu, "front_doors": 0.1, "bench": 0.0}
    return {
        "processes": processes,
        "idle": {"pass_p50_ms": 10.0, "machine_cpu": 0.5},
        "open_loop": {"pass_p50_ms": pass_ms, "machine_cpu": machine_cpu, "process_cpu": process_cpu},
    }


def test_a_point_is_saturated_when_its_workers_or_the_machine_run_out_of_cpu() -> None:
    assert not saturated(point(workers_cpu=0.6, processes=2, pass_ms=20.0), cores=2)
    assert saturated(point(workers_cpu=1.6, processes=2, pass_ms=20.0), cores=2)  # 0.8 per process
    assert saturated(point(workers_cpu=0.6, processes=2, pass_ms=20.0, machine_cpu=1.9), cores=2)
    assert saturated(point(workers_cpu=0.2, processes=2, pass_ms=800.0), cores=2)


def test_a_point_is_contended_when_other_work_takes_half_a_core() -> None:
    quiet = {"idle": {"others_cpu": 0.1}, "open_loop": {"others_cpu": 0.3}}
    busy = {"idle": {"others_cpu": 0.1}, "open_loop": {"others_cpu": 0.7}}
    assert not contended(quiet)
    assert contended(busy)
