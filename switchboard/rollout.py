"""A progressive rollout of a route's canary: its plan, its state, and the verdict on one window.

A rollout moves weight from a route's stable target (its first) to one canary target in steps
(10 → 50 → 100 % by default). Each step lasts at least an interval; then, once the canary has served
enough requests from enough distinct callers in the step's window, the canary is compared with the
stable target over the same window (`verdict`): its failure rate against stable's plus an allowance,
and its time to first token and inter-token latency p95 as ratios to stable's.

The failure rate is the share of callers that failed, not of requests: each caller (its API key, or
its stickiness key when keys are off) counts once per target per window, as failing when most of its
requests there failed. A caller chooses where it lands (a session id picks its bucket), so one caller
sending many requests, failing or not, could otherwise outweigh everyone else and fail a healthy
canary or carry a broken one; now it is one caller of at least `min_callers`. A passed check moves to the next step; the last
step (100 %) held through one more passed check promotes the canary. Failed checks count: enough of
them, or a canary failing so often that no later window could make up for it, roll it back to 0 %
at once.

Requests that waited for a model load are counted apart and left out of the time to first token: a
canary is never failed for its cold start.

The state is JSON in the route's hash (`switchboard.routes`, field `rollout`), written with the
weights in one transaction, so that it survives every front door's restart and every front door
applies the same weights. The phases:

    warming → stepping → holding → promoted
        ↘          ↘         ↘ → rolled_back | aborted
"""

from __future__ import annotations

import itertools
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Literal

import msgspec

Phase = Literal["warming", "stepping", "holding", "promoted", "rolled_back", "aborted"]
RUNNING: frozenset[str] = frozenset({"warming", "stepping", "holding"})

# The latency histograms' buckets: log-spaced upper bounds from 0.1 ms by 20 % each, to about 50 s
# (the last bucket holds everything above). A p95 read from summed counts is within 20 % of the
# true one, and both targets are read alike, so their ratio is not skewed.
BUCKET_BASE_S = 0.0001
BUCKET_FACTOR = 1.2
BUCKET_COUNT = 72
# How many events a rollout keeps (the newest).
EVENTS_KEPT = 20


class PlanError(ValueError):
    """A plan a route cannot run; the message says why."""


class RolloutPlan(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How a canary is rolled out; every field but `canary` has the default a careful operator picks."""

    canary: str
    # The canary's weight (percent) at each step, rising, the last one 100.
    steps: tuple[int, ...] = (10, 50, 100)
    # The least time a step lasts before its check (and the hold at 100 % before promotion).
    interval_s: float = 60.0
    # The canary's requests a step's window needs before it is judged.
    min_requests: int = 20
    # ... and the distinct callers they come from. One caller weighs 1 / callers of the failure
    # rate: at 20, a caller alone never exceeds the default allowance of 5 points. A route whose
    # traffic comes from a few keys needs a lower one, or its rollout waits.
    min_callers: int = 20
    # The canary's failure rate may exceed stable's by this much (0.05: 5 percentage points).
    max_failure_excess: float = 0.05
    # The canary's p95 time to first token and inter-token latency, as ratios to stable's.
    max_ttft_p95_ratio: float = 1.5
    max_itl_p95_ratio: float = 1.5
    # Failed checks that roll the canary back.
    failed_checks_to_roll_back: int = 2
    # A canary failing this share of its callers (at least `min_callers`) is rolled back at the first check.
    fatal_failure_rate: float = 0.5
    # How long the canary may take to be warm before the rollout gives up (rolled back).
    warm_timeout_s: float = 600.0


def checked_plan(plan: RolloutPlan, targets: Sequence[str], weights: Sequence[int]) -> RolloutPlan:
    """`plan` if route with `targets` (stable first) and live `weights` can run it; PlanError if not."""
    if plan.canary not in targets:
        raise PlanError(
            f"the canary must be a target of the route ({', '.join(targets)}), not {plan.canary!r}"
        )
    if plan.canary == targets[0]:
        raise PlanError(f"{plan.canary} is the route's stable target (its first); the canary is another")
    steps = plan.steps
    if not steps or any(isinstance(s, bool) or not 1 <= s <= 100 for s in steps):
        raise PlanError(f"steps must be whole percents from 1 to 100, not {list(steps)}")
    if any(b <= a for a, b in itertools.pairwise(steps)) or steps[-1] != 100:
        raise PlanError(f"steps must rise and end at 100, not {list(steps)}")
    others = [t for t, w in zip(targets, weights, strict=True) if w and t not in (targets[0], plan.canary)]
    if others:
        raise PlanError(f"the route's other targets must have weight 0 during a rollout: {', '.join(others)}")
    _require(plan.interval_s > 0 and math.isfinite(plan.interval_s), "interval_s must be above 0")
    _require(plan.min_requests >= 1, "min_requests must be at least 1")
    _require(plan.min_callers >= 1, "min_callers must be at least 1")
    _require(0 <= plan.max_failure_excess <= 1, "max_failure_excess must be from 0 to 1")
    _require(plan.max_ttft_p95_ratio >= 1, "max_ttft_p95_ratio must be at least 1")
    _require(plan.max_itl_p95_ratio >= 1, "max_itl_p95_ratio must be at least 1")
    _require(plan.failed_checks_to_roll_back >= 1, "failed_checks_to_roll_back must be at least 1")
    _require(0 < plan.fatal_failure_rate <= 1, "fatal_failure_rate must be above 0, at most 1")
    _require(plan.warm_timeout_s > 0, "warm_timeout_s must be above 0")
    return plan


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise PlanError(message)


class Figures(msgspec.Struct, frozen=True, kw_only=True):
    """One target's requests in one window, as a check saw them."""

    requests: int
    failures: int
    # Requests whose first chunk waited for a model load (left out of time to first token).
    cold: int = 0
    # The distinct callers of those requests, and those of them most of whose requests failed.
    callers: int = 0
    failing_callers: int = 0
    # failing_callers / callers: each caller counts once.
    failure_rate: float
    ttft_p95_s: float | None = None
    itl_p95_s: float | None = None


class Check(msgspec.Struct, frozen=True, kw_only=True):
    """One judgement of the canary against stable over one window."""

    at: float
    passed: bool
    canary: Figures
    stable: Figures
    # Why it failed (empty when it passed).
    reasons: tuple[str, ...] = ()


class RolloutEvent(msgspec.Struct, frozen=True, kw_only=True):
    at: float
    event: str
    detail: str = ""


class RolloutState(msgspec.Struct, frozen=True, kw_only=True):
    """Where one rollout stands; stored as JSON in its route's hash."""

    id: str
    plan: RolloutPlan
    stable: str
    phase: Phase
    started: float
    # The index in `plan.steps` of the canary's current weight (its weight is 0 while warming).
    step: int = 0
    step_started: float
    # The window observations are counted in: a new one starts with each check.
    window: int = 0
    checks_failed: int = 0
    last_check: Check | None = None
    # Stable's figures from the last window it served enough requests in: what the canary is
    # compared with once it takes all the traffic.
    baseline: Figures | None = None
    ended: float | None = None
    reason: str | None = None
    events: tuple[RolloutEvent, ...] = ()

    @property
    def running(self) -> bool:
        return self.phase in RUNNING

    def canary_weight(self) -> int:
        """The canary's weight in this state (percent)."""
        if self.phase in ("stepping", "holding", "promoted"):
            return self.plan.steps[self.step]
        return 0

    def weights(self, targets: Sequence[str]) -> tuple[int, ...]:
        """The route's weights in this state: the canary's step, stable the rest, others 0."""
        canary = self.canary_weight()
        return tuple(
            canary if t == self.plan.canary else 100 - canary if t == self.stable else 0 for t in targets
        )

    def moved(
        self, phase: Phase, event: str, detail: str = "", now: float | None = None, **changes: object
    ) -> RolloutState:
        """This state in `phase`, with `event` noted (and `changes` applied)."""
        now = time.time() if now is None else now
        events = (*self.events, RolloutEvent(at=now, event=event, detail=detail))[-EVENTS_KEPT:]
        if phase not in RUNNING:
            changes.setdefault("ended", now)
        return msgspec.structs.replace(self, phase=phase, events=events, **changes)  # type: ignore[arg-type]


def new_rollout(plan: RolloutPlan, stable: str, now: float | None = None) -> RolloutState:
    """A rollout of `plan` that starts by warming its canary."""
    now = time.time() if now is None else now
    return RolloutState(
        id=uuid.uuid4().hex[:12],
        plan=plan,
        stable=stable,
        phase="warming",
        started=now,
        step_started=now,
        events=(RolloutEvent(at=now, event="started", detail=f"canary {plan.canary}"),),
    )


_state_decoder = msgspec.json.Decoder(RolloutState)


def encode_state(state: RolloutState) -> bytes:
    return msgspec.json.encode(state)


def decode_state(raw: bytes | str | None) -> RolloutState | None:
    """The state stored in a route's hash; None when there is none or it cannot be read."""
    if not raw:
        return None
    try:
        return _state_decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


# --- Latency histograms -------------------------------------------------------------------------


def bucket_index(seconds: float) -> int:
    """The histogram bucket that holds `seconds`."""
    if seconds <= BUCKET_BASE_S:
        return 0
    index = math.ceil(math.log(seconds / BUCKET_BASE_S) / math.log(BUCKET_FACTOR) - 1e-9)
    return min(index, BUCKET_COUNT - 1)


def bucket_upper_s(index: int) -> float:
    """The upper bound of bucket `index` (the last one holds everything above the one before)."""
    return BUCKET_BASE_S * BUCKET_FACTOR**index


def p95(counts: Mapping[int, int]) -> float | None:
    """The 95th percentile of a histogram (bucket index → count), as its bucket's upper bound."""
    total = sum(counts.values())
    if total <= 0:
        return None
    rank = math.ceil(0.95 * total)
    seen = 0
    for index in sorted(counts):
        seen += counts[index]
        if seen >= rank:
            return bucket_upper_s(index)
    return bucket_upper_s(max(counts))


# --- The verdict on one window ------------------------------------------------------------------


class Window(msgspec.Struct, kw_only=True):
    """What every front door counted for one target in one window (summed)."""

    requests: int = 0
    failures: int = 0
    cold: int = 0
    ttft: dict[int, int] = msgspec.field(default_factory=dict)
    itl: dict[int, int] = msgspec.field(default_factory=dict)
    # Caller (a digest of who it is) → its requests, and its failed ones.
    caller_requests: dict[str, int] = msgspec.field(default_factory=dict)
    caller_failures: dict[str, int] = msgspec.field(default_factory=dict)

    def figures(self) -> Figures:
        callers = len(self.caller_requests)
        failing = sum(
            1
            for caller, requests in self.caller_requests.items()
            if failing_caller(requests, self.caller_failures.get(caller, 0))
        )
        return Figures(
            requests=self.requests,
            failures=self.failures,
            cold=self.cold,
            callers=callers,
            failing_callers=failing,
            failure_rate=failing / callers if callers else 0.0,
            ttft_p95_s=p95(self.ttft),
            itl_p95_s=p95(self.itl),
        )


def failing_caller(requests: int, failures: int) -> bool:
    """Whether a caller counts as failing in a window: most of its requests there failed."""
    return 2 * failures > requests


def enough(plan: RolloutPlan, figures: Figures) -> bool:
    """Whether a target's window holds enough requests from enough callers to be judged."""
    return figures.requests >= plan.min_requests and figures.callers >= plan.min_callers


Outcome = Literal["wait", "pass", "fail", "fatal"]


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    outcome: Outcome
    canary: Figures
    stable: Figures
    reasons: tuple[str, ...] = ()

    def check(self, at: float) -> Check:
        """This verdict as the check a rollout's state keeps (not for "wait")."""
        passed = self.outcome == "pass"
        return Check(at=at, passed=passed, canary=self.canary, stable=self.stable, reasons=self.reasons)


def verdict(plan: RolloutPlan, canary: Window, stable: Window, baseline: Figures | None = None) -> Verdict:
    """The canary against stable over one window: "wait" (too few canary requests or callers yet),
    "pass", "fail" (a failed check), or "fatal" (failing so often that it rolls back at once).

    Stable's figures come from `baseline` when stable served too few requests or callers in the
    window (the canary takes all the traffic); with neither, only the failure rate is judged
    (against 0). Failure rates are shares of callers (see the module's note).
    """
    mine = canary.figures()
    theirs = stable.figures()
    if not enough(plan, mine):
        return Verdict(outcome="wait", canary=mine, stable=theirs)
    reference = theirs if enough(plan, theirs) or baseline is None else baseline
    if mine.failure_rate >= plan.fatal_failure_rate:
        reason = (
            f"failure rate {_percent(mine.failure_rate)} {_of_callers(mine)} "
            f"(rolls back at once from {_percent(plan.fatal_failure_rate)})"
        )
        return Verdict(outcome="fatal", canary=mine, stable=theirs, reasons=(reason,))
    reasons: list[str] = []
    stable_rate = reference.failure_rate if reference.callers else 0.0
    if mine.failure_rate > stable_rate + plan.max_failure_excess + 1e-12:
        reasons.append(
            f"failure rate {_percent(mine.failure_rate)} {_of_callers(mine)} vs stable's {_percent(stable_rate)} "
            f"(limit +{plan.max_failure_excess * 100:g} points)"
        )
    for signal, ours, reference_s, limit in (
        ("TTFT p95", mine.ttft_p95_s, reference.ttft_p95_s, plan.max_ttft_p95_ratio),
        ("ITL p95", mine.itl_p95_s, reference.itl_p95_s, plan.max_itl_p95_ratio),
    ):
        if ours is not None and reference_s is not None and ours > reference_s * limit * (1 + 1e-9):
            reasons.append(f"{signal} {ours / reference_s:.1f}× stable's (limit {limit:g}×)")
    return Verdict(outcome="fail" if reasons else "pass", canary=mine, stable=theirs, reasons=tuple(reasons))


def _percent(rate: float) -> str:
    return f"{rate * 100:.1f} %"


def _of_callers(figures: Figures) -> str:
    return f"({figures.failing_callers} of {figures.callers} callers)"


def after_check(state: RolloutState, judged: Verdict, now: float) -> RolloutState:
    """The state that follows a judged window (not "wait"): a pass moves to the next step, or
    promotes from the hold at 100 %; a failure counts, and enough of them, or a fatal one, roll
    back. Every check but the last starts a new window."""
    plan = state.plan
    baseline = judged.stable if enough(plan, judged.stable) else state.baseline
    judged_state = msgspec.structs.replace(state, last_check=judged.check(now), baseline=baseline)
    if judged.outcome == "pass":
        if state.phase == "holding":
            return judged_state.moved("promoted", "promoted", now=now)
        step = state.step + 1
        phase: Phase = "holding" if step == len(plan.steps) - 1 else "stepping"
        detail = f"{plan.steps[step]} %"
        return judged_state.moved(
            phase, "step", detail, now, step=step, step_started=now, window=state.window + 1
        )
    failed = state.checks_failed + 1
    reason = "; ".join(judged.reasons)
    if judged.outcome == "fatal" or failed >= plan.failed_checks_to_roll_back:
        return judged_state.moved(
            "rolled_back", "rolled_back", reason, now, checks_failed=failed, reason=reason
        )
    return judged_state.moved(
        state.phase,
        "check_failed",
        reason,
        now,
        checks_failed=failed,
        step_started=now,
        window=state.window + 1,
    )
