"""The routes of the configuration (`[routes.NAME]`): their targets and first weights, and their
shadow versions. How a route places its callers, and its live weights, are `switchboard.routes`."""

from __future__ import annotations

from typing import Annotated

import msgspec

from switchboard.config.names import ModelName


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
