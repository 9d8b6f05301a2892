"""The routes of the configuration (`[routes.NAME]`): their targets and weights, and their shadow
versions; read by `switchboard.config`, checked against its models here."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Annotated

import msgspec

from switchboard.config_names import ModelName


class RouteConfigError(ValueError):
    """A route the configuration cannot hold; the message names it and says why."""


class ShadowConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A route's shadow version: a share of its requests is copied to it, at the lowest priority, and
    nobody sees its answers (`router.routing.rollouts.shadow`). `[routes.chat.shadow] model = "chat-v3"`."""

    # A configured model that is not a target of the route.
    model: ModelName
    # The share of the route's requests copied (0.5 copies one in two hundred).
    percent: Annotated[float, msgspec.Meta(ge=0, le=100)]
    # A copy is dropped when this many jobs already wait on the shadow model's queue.
    max_waiting: Annotated[int, msgspec.Meta(ge=1)] = 4
    # False: a copy is sent only while a live worker holds the shadow model warm, so that shadow
    # traffic never loads it; true: copies may wake it.
    may_load: bool = False
    # Keep each compared pair (both answers, their times to first token and finish reasons) in a
    # capped Redis stream for offline comparison (`switchboard shadow-answers ROUTE`).
    keep_answers: bool = False


class RouteConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A route: a name clients use that resolves to one of its target models by weight
    (`switchboard.routes`). `[routes.chat] targets = {"chat-v1" = 90, "chat-v2" = 10}`.

    The targets' order is fixed (stable first, canary last): callers are placed on cumulative ranges
    in that order. These weights are the first ones; the live ones are in Redis (`switchboard routes set`).
    """

    targets: dict[ModelName, int]
    shadow: ShadowConfig | None = None


def check_routes(
    routes: Mapping[str, RouteConfig], model_names: list[str], pipeline_names: Collection[str] = ()
) -> None:
    """RouteConfigError unless every route has a free name, known targets (models or pipelines),
    weights it can take, and a shadow version that is a configured model outside its targets."""
    # Imported here: the routes module speaks to Redis, which reading a config does not need.
    from switchboard.routes import WeightsError, checked_weights

    for name, route in routes.items():
        if name in model_names:
            raise RouteConfigError(f"routes.{name}: a route may not take the name of a model")
        unknown = sorted(set(route.targets) - set(model_names) - set(pipeline_names))
        if unknown:
            raise RouteConfigError(
                f"routes.{name}: targets name unknown models: {', '.join(unknown)}; "
                f"configured models are: {', '.join(model_names)}"
                + (f"; pipelines: {', '.join(pipeline_names)}" if pipeline_names else "")
            )
        try:
            checked_weights(list(route.targets), route.targets)
        except WeightsError as exc:
            raise RouteConfigError(f"routes.{name}: {exc}") from None
        if route.shadow is not None:
            _check_shadow(name, route.shadow.model, list(route.targets), model_names)


def _check_shadow(name: str, shadow: str, targets: list[str], model_names: list[str]) -> None:
    if shadow not in model_names:
        raise RouteConfigError(
            f"routes.{name}.shadow: model {shadow!r} is not configured; "
            f"configured models are: {', '.join(model_names)}"
        )
    if shadow in targets:
        raise RouteConfigError(
            f"routes.{name}.shadow: model {shadow!r} is a target of the route; a shadow version gets "
            "copies of the route's requests, so it must be another model"
        )
