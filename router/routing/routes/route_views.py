"""How routes are shown: to operators (`/admin/routes`) and in the OpenAI model list (`/v1/models`)."""

from __future__ import annotations

from typing import Literal

import msgspec

from router.openai.models import ModelCard
from switchboard.rollout import Check, Phase, RolloutEvent, RolloutPlan, RolloutState
from switchboard.routes import Route


class RouteTarget(msgspec.Struct, kw_only=True):
    """One target of a route and its live weight (percent)."""

    model: str
    weight: int


class RolloutStatus(msgspec.Struct, kw_only=True):
    """A route's last rollout, as operators see it: where it stands, its last check, why it ended."""

    id: str
    canary: str
    stable: str
    phase: Phase
    # The current step, from 1 (0 while warming), of `plan.steps`; the canary's weight now.
    step: int
    canary_weight: int
    checks_failed: int
    started: float
    step_started: float
    ended: float | None = None
    reason: str | None = None
    # The last judgement: the canary's and stable's figures over the same window.
    last_check: Check | None = None
    plan: RolloutPlan
    events: list[RolloutEvent]


class RouteStatus(msgspec.Struct, kw_only=True):
    """A route as `/admin/routes` shows it: its targets in their fixed order, and its version."""

    name: str
    targets: list[RouteTarget]
    version: int
    # Unix seconds of the last change of its weights; None before Redis held any.
    updated: float | None = None
    # The route's last progressive rollout (running or ended); None before its first.
    rollout: RolloutStatus | None = None


class RouteStatusList(msgspec.Struct, kw_only=True):
    """Body of `GET /admin/routes`."""

    data: list[RouteStatus]
    object: Literal["list"] = "list"


class RouteCard(ModelCard, kw_only=True):
    """A route in `/v1/models`: a model card that says it is a route, and to which models."""

    owned_by: str = "switchboard-route"
    targets: list[str] = msgspec.field(default_factory=list)


def route_status(route: Route) -> RouteStatus:
    """What an operator sees of `route`."""
    targets = [RouteTarget(model=m, weight=w) for m, w in zip(route.targets, route.weights, strict=True)]
    rollout = None if route.rollout is None else rollout_status(route.rollout)
    return RouteStatus(
        name=route.name, targets=targets, version=route.version, updated=route.updated, rollout=rollout
    )


def rollout_status(state: RolloutState) -> RolloutStatus:
    """What an operator sees of a rollout."""
    warming = state.phase == "warming" or (state.phase in ("rolled_back", "aborted") and not state.window)
    return RolloutStatus(
        id=state.id,
        canary=state.plan.canary,
        stable=state.stable,
        phase=state.phase,
        step=0 if warming else state.step + 1,
        canary_weight=state.canary_weight(),
        checks_failed=state.checks_failed,
        started=state.started,
        step_started=state.step_started,
        ended=state.ended,
        reason=state.reason,
        last_check=state.last_check,
        plan=state.plan,
        events=list(state.events),
    )
