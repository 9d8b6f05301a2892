"""How routes are shown: to operators (`/admin/routes`) and in the OpenAI model list (`/v1/models`)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from router.openai.models import ModelCard
from switchboard.routes import Route


class RouteTarget(msgspec.Struct, kw_only=True):
    """One target of a route and its live weight (percent)."""

    model: str
    weight: int


class RouteStatus(msgspec.Struct, kw_only=True):
    """A route as `/admin/routes` shows it: its targets in their fixed order, and its version."""

    name: str
    targets: list[RouteTarget]
    version: int
    # Unix seconds of the last change of its weights; None before Redis held any.
    updated: float | None = None
    # A progressive rollout's state; none runs yet (not built).
    rollout: Any = None


class RouteStatusList(msgspec.Struct, kw_only=True):
    """Body of `GET /admin/routes`."""

    data: list[RouteStatus]
    object: Literal["list"] = "list"


class WeightsRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `PUT /admin/routes/{name}/weights`: every target → a whole percent, summing to 100."""

    weights: dict[str, Any]


class RouteCard(ModelCard, kw_only=True):
    """A route in `/v1/models`: a model card that says it is a route, and to which models."""

    owned_by: str = "switchboard-route"
    targets: list[str] = msgspec.field(default_factory=list)


def route_status(route: Route) -> RouteStatus:
    """What an operator sees of `route`."""
    targets = [RouteTarget(model=m, weight=w) for m, w in zip(route.targets, route.weights, strict=True)]
    return RouteStatus(name=route.name, targets=targets, version=route.version, updated=route.updated)
