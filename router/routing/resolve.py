"""Which model serves a request that names a route or a pipeline, what answers should it fail, and
how the answer says so.

A request naming a route is resolved here, before anything is queued, to one of the route's targets:
the caller's key must be allowed the route (it then may use its targets through it), and the caller
is placed by a stickiness key, so that the same caller stays on the same target while weights stay.
The stickiness key is, first found: the `x-session-id` header, the request's `user`, the API key,
the client's address (with no keys); with keys, a session or user is scoped by the key, so that a
key choosing session ids chooses among its own buckets only, never another key's. A running
rollout judges the versions by caller (`router.telemetry.rollout_observations.judged_as`): the key, else the
stickiness key. Everything after (admission, limits, context checks, the job,
the answer's `model`) uses the target, the model that serves. A pipeline of fallbacks
(`switchboard.config.pipelines`) serves with its first step and keeps the others, in order, for a
failure before the first byte; a route keeps its stable version for a canary's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import msgspec
from litestar import Request, Response

from router.admission.auth import Caller
from router.openai.errors import ModelNotFoundError, OpenAIError
from router.routing.routes.route_table import RouteTable
from router.telemetry.requests import current_request
from router.telemetry.rollout_observations import judged_as
from switchboard.config import PipelineLookup
from switchboard.routes import Route
from switchboard.wire import Job

SESSION_HEADER = "x-session-id"
ROUTE_HEADER = "x-switchboard-route"
PIPELINE_HEADER = "x-switchboard-pipeline"
MODEL_HEADER = "x-switchboard-model"
# The span attributes of a routed request (the served model is `gen_ai.request.model`, as unrouted).
ROUTE_ATTRIBUTE = "switchboard.route"
PIPELINE_ATTRIBUTE = "switchboard.pipeline"
REQUESTED_ATTRIBUTE = "switchboard.requested_model"


@dataclass(frozen=True, slots=True)
class Resolution:
    """The name a request gave, what serves it, the route (and pipeline) between them, and what
    answers instead, in order, should it fail before the first byte (`router.routing.fallback`): a
    route's stable version, a pipeline's later steps.

    What serves is a model, or a pipeline of the router or cascade shape, which the request's
    pipeline (`router.pipeline`) then runs as a step of its own; `notes` are headers that earlier
    steps add to the answer (the router that chose, the draft that was not kept)."""

    requested: str
    served: str
    route: Route | None = None
    pipeline: str | None = None
    # The fallbacks: each a model (or a router or cascade pipeline) and the route it comes through.
    later: tuple[tuple[str, Route | None], ...] = ()
    notes: tuple[tuple[str, str], ...] = ()

    def fallback(self) -> Resolution | None:
        """The same request resolved to its next fallback; None when none is left."""
        if not self.later:
            return None
        (model, route), *rest = self.later
        return replace(self, served=model, route=route, later=tuple(rest))

    def alone(self) -> Resolution:
        """The same request with no fallback (a resumed stream: its job exists already)."""
        return replace(self, later=())

    def served_by(self, model: str) -> Resolution:
        """The same request, answered by `model` (a resumed stream's job keeps the version it had)."""
        return self if model == self.served else replace(self, served=model)

    def noted(self, *notes: tuple[str, str]) -> Resolution:
        """The same request with headers that a step adds to its answer."""
        return replace(self, notes=(*self.notes, *notes))

    def then(self, *later: tuple[str, Route | None]) -> Resolution:
        """The same request with more fallbacks after its own (each model kept once)."""
        return replace(self, later=tuple(_deduplicated([*self.later, *later], skip={self.served})))

    @property
    def chosen_for_the_caller(self) -> bool:
        """Whether the caller named a route or pipeline, whose key then may use the served model."""
        return self.route is not None or self.pipeline is not None

    def applied_to(self, job: Job) -> Job:
        """`job` naming the route it came through, if any (its `model` is already the served one)."""
        return job if self.route is None else msgspec.structs.replace(job, route=self.route.name)

    def label(self, answer: Response[Any]) -> None:
        """Name the serving model (and the route, if any) in `answer`'s headers."""
        for name, value in self.headers().items():
            answer.set_header(name, value)

    @contextmanager
    def naming_errors(self) -> Iterator[None]:
        """Errors raised within name the model (and route) too, unless an inner one named them, or the
        model is no model here (a 404 names nothing that does not exist)."""
        try:
            yield
        except OpenAIError as error:
            if isinstance(error, ModelNotFoundError):
                raise
            for name, value in self.headers().items():
                error.headers.setdefault(name, value)
            raise

    def headers(self) -> dict[str, str]:
        """The headers that name the serving model, and the route and pipeline, if any."""
        named = {MODEL_HEADER: self.served, **dict(self.notes)}
        if self.route is not None:
            named[ROUTE_HEADER] = self.route.name
        if self.pipeline is not None:
            named[PIPELINE_HEADER] = self.pipeline
        return named


def resolve(
    routes: RouteTable,
    pipelines: PipelineLookup,
    name: str,
    caller: Caller,
    stickiness_key: str,
) -> Resolution:
    """What serves a request naming `name`, and its fallbacks: `name` itself unless it is a route or
    a pipeline (a 403 for one the caller's key may not use; its key then may use what the route or
    pipeline leads to)."""
    # Its jobs count for this caller in a rollout's judgement, however many it sends.
    judged_as(caller.owner or stickiness_key)
    if pipelines.get(name) is not None:
        caller.require_model(name)
        _note_on_span(PIPELINE_ATTRIBUTE, name)
        return _resolved(
            Resolution(name, name, pipeline=name), _placed(routes, pipelines, name, stickiness_key)
        )
    route = routes.get(name)
    if route is None:
        return Resolution(requested=name, served=name)
    caller.require_model(name)
    _note_on_span(ROUTE_ATTRIBUTE, name)
    return _resolved(Resolution(name, name), _placed(routes, pipelines, name, stickiness_key))


def resolve_step(
    routes: RouteTable, pipelines: PipelineLookup, step: str, stickiness_key: str, within: Resolution
) -> Resolution:
    """What serves step `step` of the pipeline `within` runs (a router's target, a cascade's draft or
    strong model), and its fallbacks; the request, its pipeline and notes stay `within`'s, and so does
    the route that led to the pipeline, for the models no route of their own places."""
    chain = _placed(routes, pipelines, step, stickiness_key)
    return _resolved(within, [(model, route or within.route) for model, route in chain])


def _resolved(request: Resolution, chain: list[tuple[str, Route | None]]) -> Resolution:
    (served, route), *later = _deduplicated(chain)
    return replace(request, served=served, route=route, later=tuple(later))


def _placed(
    routes: RouteTable,
    pipelines: PipelineLookup,
    step: str,
    stickiness_key: str,
    placed: dict[str, list[tuple[str, Route | None]]] | None = None,
) -> list[tuple[str, Route | None]]:
    """What a step sends a caller to, in order: a model itself; a route's version for this caller,
    then the route's stable version if that is another; a pipeline of fallbacks, its steps placed in
    turn; a router or cascade pipeline itself (it runs as a step of its own). The config refuses
    loops (`switchboard.name_graph`), so this ends.

    Each name is placed once per request (`placed`, each list without repeats): pipelines that name
    the same pipelines would otherwise be walked once per path through them, 2^depth times."""
    placed = {} if placed is None else placed
    known = placed.get(step)
    if known is not None:
        return known
    chain = _chain(routes, pipelines, step, stickiness_key, placed)
    placed[step] = chain
    return chain


def _chain(
    routes: RouteTable,
    pipelines: PipelineLookup,
    step: str,
    stickiness_key: str,
    placed: dict[str, list[tuple[str, Route | None]]],
) -> list[tuple[str, Route | None]]:
    pipeline = pipelines.get(step)
    if pipeline is not None:
        if pipeline.shape != "fallbacks":
            return [(step, None)]
        return _deduplicated(
            [
                found
                for inner in pipeline.steps()
                for found in _placed(routes, pipelines, inner, stickiness_key, placed)
            ]
        )
    route = routes.get(step)
    if route is None:
        return [(step, None)]
    target, stable = route.target_for(stickiness_key), route.targets[0]
    chosen = [target] if target == stable else [target, stable]
    # A version that is a pipeline answers through its steps, each counted under the route.
    return _deduplicated(
        [
            (found, inner_route or route)
            for version in chosen
            for found, inner_route in _placed(routes, pipelines, version, stickiness_key, placed)
        ]
    )


def _deduplicated(
    chain: list[tuple[str, Route | None]], skip: set[str] | None = None
) -> list[tuple[str, Route | None]]:
    """`chain` with each model kept at its first place only (it would fail the same way again)."""
    seen: set[str] = set(skip or ())
    kept = []
    for model, route in chain:
        if model not in seen:
            seen.add(model)
            kept.append((model, route))
    return kept


def answering_model(served: str, pipelines: PipelineLookup) -> str:
    """The model that first answers for `served`: itself, or a router's default's, a cascade's draft's."""
    seen: set[str] = set()
    while (pipeline := pipelines.get(served)) is not None and served not in seen:
        seen.add(served)
        if pipeline.router is not None:
            served = pipeline.router.targets[pipeline.router.default].model
        elif pipeline.cascade is not None:
            served = pipeline.cascade.draft
        else:
            served = pipeline.fallbacks[0]
    return served


def stickiness_key(request: Request[Any, Any, Any], user: str | None, caller: Caller) -> str:
    """Who the caller is, for sticky placement: session header, else `user`, else key, else address;
    a session or user within its key when keys are on.

    Each kind is tagged, so that a session id never meets a user name of the same text."""
    session = request.headers.get(SESSION_HEADER)
    own = f"session:{session}" if session else f"user:{user}" if user else None
    if caller.key_sha256:
        key = f"key:{caller.key_sha256}"
        return key if own is None else f"{key}/{own}"
    if own is not None:
        return own
    client = request.client
    return f"address:{client.host if client else ''}"


def _note_on_span(attribute: str, name: str) -> None:
    observed = current_request()
    if observed is not None and observed.span is not None:
        observed.span.set_attribute(attribute, name)
        observed.span.set_attribute(REQUESTED_ATTRIBUTE, name)
