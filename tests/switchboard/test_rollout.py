"""The pure parts of a rollout: its plan's checks, the verdict on a window, its state in JSON, p95
from histogram counts, and the counts of a window hash read back."""

from __future__ import annotations

import contextvars

import pytest

from router.telemetry.rollout_observations import Observations, judged_as, windows_from
from switchboard.rollout import (
    BUCKET_COUNT,
    PlanError,
    RolloutPlan,
    Window,
    after_check,
    bucket_index,
    bucket_upper_s,
    checked_plan,
    decode_state,
    encode_state,
    new_rollout,
    p95,
    verdict,
)
from switchboard.routes import Route

TARGETS = ("chat-v1", "chat-v2")
PLAN = RolloutPlan(canary="chat-v2", min_requests=10, min_callers=10)


def histogram(*seconds: float) -> dict[int, int]:
    counts: dict[int, int] = {}
    for value in seconds:
        counts[bucket_index(value)] = counts.get(bucket_index(value), 0) + 1
    return counts


def window(
    requests: int, failures: int = 0, ttft_s: float = 0.1, itl_s: float = 0.02, cold: int = 0
) -> Window:
    """A window of `requests`, each from a caller of its own, the first `failures` of them failed."""
    warm = requests - cold
    return Window(
        requests=requests,
        failures=failures,
        cold=cold,
        ttft=histogram(*[ttft_s] * warm),
        itl=histogram(*[itl_s] * requests),
        caller_requests={f"{n:016x}": 1 for n in range(requests)},
        caller_failures={f"{n:016x}": 1 for n in range(failures)},
    )


def with_caller(base: Window, caller: str, requests: int, failures: int) -> Window:
    """`base` with one more caller, who sent `requests` of which `failures` failed."""
    return Window(
        requests=base.requests + requests,
        failures=base.failures + failures,
        ttft=base.ttft,
        itl=base.itl,
        caller_requests={**base.caller_requests, caller: requests},
        caller_failures={**base.caller_failures, caller: failures},
    )


def test_the_defaults_are_a_careful_operators() -> None:
    plan = RolloutPlan(canary="chat-v2")
    assert plan.steps == (10, 50, 100) and plan.interval_s == 60 and plan.min_requests == 20
    assert plan.max_ttft_p95_ratio == plan.max_itl_p95_ratio == 1.5
    assert plan.max_failure_excess == 0.05 and plan.failed_checks_to_roll_back == 2
    assert checked_plan(plan, TARGETS, (100, 0)) is plan


@pytest.mark.parametrize(
    ("plan", "weights", "says"),
    [
        (RolloutPlan(canary="chat-v3"), (100, 0), "must be a target"),
        (RolloutPlan(canary="chat-v1"), (100, 0), "stable target"),
        (RolloutPlan(canary="chat-v2", steps=()), (100, 0), "whole percents"),
        (RolloutPlan(canary="chat-v2", steps=(10, 0, 100)), (100, 0), "whole percents"),
        (RolloutPlan(canary="chat-v2", steps=(50, 10, 100)), (100, 0), "rise"),
        (RolloutPlan(canary="chat-v2", steps=(10, 50)), (100, 0), "end at 100"),
        (RolloutPlan(canary="chat-v2", interval_s=0), (100, 0), "interval_s"),
        (RolloutPlan(canary="chat-v2", min_requests=0), (100, 0), "min_requests"),
        (RolloutPlan(canary="chat-v2", max_ttft_p95_ratio=0.9), (100, 0), "max_ttft_p95_ratio"),
        (RolloutPlan(canary="chat-v2", max_failure_excess=-0.1), (100, 0), "max_failure_excess"),
        (RolloutPlan(canary="chat-v2", failed_checks_to_roll_back=0), (100, 0), "failed_checks"),
    ],
)
def test_a_plan_the_route_cannot_run_says_why(plan: RolloutPlan, weights: tuple[int, int], says: str) -> None:
    with pytest.raises(PlanError, match=says):
        checked_plan(plan, TARGETS, weights)


def test_other_targets_must_be_at_zero() -> None:
    with pytest.raises(PlanError, match="chat-v3"):
        checked_plan(RolloutPlan(canary="chat-v2"), (*TARGETS, "chat-v3"), (80, 0, 20))


def test_the_verdict_waits_for_enough_canary_requests_then_passes_a_healthy_canary() -> None:
    assert verdict(PLAN, window(9), window(50)).outcome == "wait"
    judged = verdict(PLAN, window(10, ttft_s=0.12), window(50))
    assert judged.outcome == "pass", judged.reasons
    assert judged.canary.requests == 10 and judged.stable.requests == 50


def test_a_slow_canary_fails_its_check_with_the_ratio_in_the_reason() -> None:
    judged = verdict(PLAN, window(20, ttft_s=0.24), window(50, ttft_s=0.1))
    assert judged.outcome == "fail"
    assert judged.reasons == ("TTFT p95 2.5× stable's (limit 1.5×)",)
    slow_tokens = verdict(PLAN, window(20, itl_s=0.1), window(50, itl_s=0.02))
    assert slow_tokens.outcome == "fail" and slow_tokens.reasons[0].startswith("ITL p95 ")


def test_cold_starts_are_not_held_against_the_canary() -> None:
    # Five of twenty waited 30 s for a load: they are counted apart, their TTFT left out.
    canary = window(20, cold=5)
    assert verdict(PLAN, canary, window(50)).outcome == "pass"
    assert canary.figures().cold == 5


def test_failure_rates_compare_with_stable_plus_the_allowance_and_a_hopeless_canary_is_fatal() -> None:
    assert verdict(PLAN, window(20, failures=1), window(50, failures=0)).outcome == "pass"  # 5 %
    failing = verdict(PLAN, window(20, failures=4), window(50, failures=1))  # 20 % vs 2 %
    assert failing.outcome == "fail"
    assert failing.reasons == ("failure rate 20.0 % (4 of 20 callers) vs stable's 2.0 % (limit +5 points)",)
    assert verdict(PLAN, window(20, failures=10), window(50)).outcome == "fatal"


def test_each_caller_counts_once_so_one_caller_can_neither_fail_nor_carry_a_canary() -> None:
    # Nineteen healthy callers and one that sends 100 failing requests: one failing caller in 20
    # (5 %, within the allowance), not 100 failures in 119 requests (84 %, fatal).
    flooded = with_caller(window(19), "f" * 16, requests=100, failures=100)
    judged = verdict(PLAN, flooded, window(50))
    assert judged.outcome == "pass", judged.reasons
    assert (judged.canary.requests, judged.canary.failures) == (119, 100)
    assert (judged.canary.callers, judged.canary.failing_callers) == (20, 1)
    # Ten callers whose requests failed, and one that sends 1,000 that succeed: 10 of 11 callers
    # failing is fatal, where 10 failures in 1,010 requests (1 %) would have passed.
    carried = with_caller(window(10, failures=10), "f" * 16, requests=1000, failures=0)
    assert verdict(PLAN, carried, window(50)).outcome == "fatal"
    # A caller counts as failing when most of its requests failed.
    assert verdict(PLAN, with_caller(window(9), "f" * 16, 3, 2), window(50)).canary.failing_callers == 1
    assert verdict(PLAN, with_caller(window(9), "f" * 16, 4, 2), window(50)).canary.failing_callers == 0
    # However many requests one caller sends, the window waits for `min_callers` of them.
    alone = with_caller(Window(), "f" * 16, requests=500, failures=500)
    assert verdict(PLAN, alone, window(50)).outcome == "wait"
    assert verdict(PLAN, with_caller(window(8), "f" * 16, 50, 0), window(50)).outcome == "wait"  # 9 callers


def test_at_100_percent_the_canary_is_compared_with_stables_last_figures() -> None:
    baseline = window(50, ttft_s=0.1).figures()
    assert verdict(PLAN, window(20, ttft_s=0.3), Window(), baseline).outcome == "fail"
    assert verdict(PLAN, window(20, ttft_s=0.1), Window(), baseline).outcome == "pass"
    # With no figures of stable at all, only the failure rate is judged.
    assert verdict(PLAN, window(20, ttft_s=9.0), Window()).outcome == "pass"


def test_p95_from_histogram_counts() -> None:
    assert p95({}) is None
    values = [0.01] * 95 + [1.0] * 5
    assert p95(histogram(*values)) == pytest.approx(bucket_upper_s(bucket_index(0.01)))
    values = [0.01] * 94 + [1.0] * 6
    assert p95(histogram(*values)) == pytest.approx(bucket_upper_s(bucket_index(1.0)))
    # A bucket's bound is within 20 % above what it holds; extremes land in the first and last.
    for seconds in (0.0003, 0.02, 0.5, 7.0):
        assert seconds <= bucket_upper_s(bucket_index(seconds)) < seconds * 1.2 + 1e-12
    assert bucket_index(0.0) == 0 and bucket_index(1e6) == BUCKET_COUNT - 1


def test_the_state_survives_json_and_gives_the_weights_of_its_phase() -> None:
    state = new_rollout(PLAN, stable="chat-v1", now=100.0)
    assert decode_state(encode_state(state)) == state
    assert state.weights(TARGETS) == (100, 0)
    stepping = state.moved("stepping", "step", "10 %", 101.0, step=0, window=1)
    assert stepping.weights(TARGETS) == (90, 10) and stepping.ended is None
    half = stepping.moved("stepping", "step", "50 %", 102.0, step=1)
    assert half.weights(TARGETS) == (50, 50)
    back = half.moved("rolled_back", "rolled_back", "TTFT", 103.0, reason="TTFT")
    assert back.weights(TARGETS) == (100, 0) and back.ended == 103.0 and not back.running
    read_back = decode_state(encode_state(back))
    assert read_back is not None and [e.event for e in read_back.events] == [
        "started",
        "step",
        "step",
        "rolled_back",
    ]  # type: ignore[union-attr]
    assert decode_state(b"not json") is None and decode_state(None) is None


class _Routes:
    def __init__(self, route: Route) -> None:
        self.route = route

    def get(self, name: str) -> Route | None:
        return self.route if name == self.route.name else None


def test_observations_count_only_a_running_rollouts_targets_and_read_back_summed() -> None:
    state = new_rollout(PLAN, stable="chat-v1").moved("stepping", "step", step=0, window=3)
    observations = Observations()
    observations.watch(_Routes(Route(name="chat", targets=TARGETS, weights=(90, 10), rollout=state)))

    def handled() -> None:  # as one request's context: its caller noted for it alone
        observations.record("chat", "chat-v2", failed=False, ttft_s=0.1, itl_s=0.02)
        judged_as("key:one")  # the requests handled from here on come from this caller
        observations.record("chat", "chat-v2", failed=False, cold=True, ttft_s=30.0)
        observations.record("chat", "chat-v1", failed=True)
        observations.record("chat", "chat-v1", failed=True)
        observations.record("chat", "other", failed=True)  # not a target of the rollout
        observations.record("nope", "chat-v2", failed=True)  # no such route

    contextvars.Context().run(handled)
    [(slot, counts)] = observations._pending.items()
    assert slot == ("chat", state.id, 3)
    fields = [(name.encode(), str(count).encode()) for name, count in counts.items()]
    found = windows_from(fields + fields, ["chat-v1", "chat-v2"])  # two front doors' counts
    assert found["chat-v2"].requests == 4 and found["chat-v2"].cold == 2
    assert found["chat-v2"].ttft == {bucket_index(0.1): 2}  # the cold one's 30 s left out
    assert found["chat-v1"].requests == 4 and found["chat-v1"].failures == 4
    # Per caller: the one not noted, and `key:one`, each summed over both front doors.
    assert sorted(found["chat-v2"].caller_requests.values()) == [2, 2]
    assert (
        list(found["chat-v1"].caller_requests.values())
        == list(found["chat-v1"].caller_failures.values())
        == [4]
    )
    assert (found["chat-v1"].figures().callers, found["chat-v1"].figures().failure_rate) == (1, 1.0)


def test_checks_step_the_canary_up_promote_it_from_the_hold_and_roll_it_back_after_enough_failures() -> None:
    healthy = verdict(PLAN, window(20), window(50))
    slow = verdict(PLAN, window(20, ttft_s=0.5), window(50))
    state = new_rollout(PLAN, stable="chat-v1", now=0.0).moved("stepping", "step", "10 %", 1.0, window=1)
    state = after_check(state, healthy, 2.0)
    assert (state.phase, state.step, state.window, state.step_started) == ("stepping", 1, 2, 2.0)
    state = after_check(state, slow, 3.0)
    assert (state.phase, state.step, state.window, state.checks_failed) == ("stepping", 1, 3, 1)
    assert state.last_check is not None and not state.last_check.passed
    state = after_check(state, healthy, 4.0)
    assert (state.phase, state.step, state.weights(TARGETS)) == ("holding", 2, (0, 100))
    assert state.baseline is not None and state.baseline.requests == 50
    promoted = after_check(state, healthy, 5.0)
    assert promoted.phase == "promoted" and promoted.weights(TARGETS) == (0, 100) and promoted.ended == 5.0
    rolled_back = after_check(state, slow, 5.0)  # the second failed check of the rollout
    assert rolled_back.phase == "rolled_back" and rolled_back.weights(TARGETS) == (100, 0)
    assert rolled_back.reason == "TTFT p95 5.2× stable's (limit 1.5×)"
    fatal = after_check(state, verdict(PLAN, window(20, failures=15), window(50)), 5.0)
    assert fatal.phase == "rolled_back" and fatal.checks_failed == 2
