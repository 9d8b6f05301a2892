"""Which model serves a request that names a route, and how the answer says so.

A request naming a route is resolved here, before anything is queued, to one of the route's targets:
the caller's key must be allowed the route (it then may use its targets through it), and the caller
is placed by a stickiness key, so that the same caller stays on the same target while weights stay.
The stickiness key is, first found: the `x-session-id` header, the request's `user`, the API key,
the client's address (with no keys). Everything after (admission, limits, context checks, the job,
the answer's `model`) uses the target, the model that serves.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Request, Response

from router.admission.auth import Caller
from router.openai.errors import OpenAIError
from router.routing.table import RouteTable
from router.telemetry.requests import current_request
from switchboard.routes import Route
from switchboard.wire import Job

SESSION_HEADER = "x-session-id"
ROUTE_HEADER = "x-switchboard-route"
MODEL_HEADER = "x-switchboard-model"
# The span attributes of a routed request (the served model is `gen_ai.request.model`, as unrouted).
ROUTE_ATTRIBUTE = "switchboard.route"
REQUESTED_ATTRIBUTE = "switchboard.requested_model"


@dataclass(frozen=True, slots=True)
class Resolution:
    """The name a request gave, the model that serves it, and the route between them, if any."""

    requested: str
    served: str
    route: Route | None = None

    @property
    def fallback(self) -> str | None:
        """The model that answers when the serving one fails before the first byte: the route's stable
        version (its first target), unless that is the one serving; None for a request not routed."""
        if self.route is None or self.route.targets[0] == self.served:
            return None
        return self.route.targets[0]

    def served_by(self, model: str) -> Resolution:
        """The same request, answered by `model` (a resumed stream's job keeps the version it had)."""
        return self if model == self.served else Resolution(self.requested, model, self.route)

    def applied_to(self, job: Job) -> Job:
        """`job` naming the route it came through, if any (its `model` is already the served one)."""
        return job if self.route is None else msgspec.structs.replace(job, route=self.route.name)

    def label(self, answer: Response[Any]) -> None:
        """Name the serving model (and the route, if any) in `answer`'s headers."""
        for name, value in self.headers().items():
            answer.set_header(name, value)

    @contextmanager
    def naming_errors(self) -> Iterator[None]:
        """Errors raised within name the model (and route) too, unless an inner one named them."""
        try:
            yield
        except OpenAIError as error:
            for name, value in self.headers().items():
                error.headers.setdefault(name, value)
            raise

    def headers(self) -> dict[str, str]:
        """The headers that name the serving model, and the route, if any."""
        if self.route is None:
            return {MODEL_HEADER: self.served}
        return {MODEL_HEADER: self.served, ROUTE_HEADER: self.route.name}


def resolve(routes: RouteTable, name: str, caller: Caller, stickiness_key: str) -> Resolution:
    """The model that serves a request naming `name`: `name` itself unless it is a route (a 403 for a
    route the caller's key may not use)."""
    route = routes.get(name)
    if route is None:
        return Resolution(requested=name, served=name)
    caller.require_model(name)
    served = route.target_for(stickiness_key)
    _note_on_span(name)
    return Resolution(requested=name, served=served, route=route)


def stickiness_key(request: Request[Any, Any, Any], user: str | None, caller: Caller) -> str:
    """Who the caller is, for sticky placement: session header, else `user`, else key, else address.

    Each kind is tagged, so that a session id never meets a user name of the same text."""
    session = request.headers.get(SESSION_HEADER)
    if session:
        return f"session:{session}"
    if user:
        return f"user:{user}"
    if caller.key_sha256:
        return f"key:{caller.key_sha256}"
    client = request.client
    return f"address:{client.host if client else ''}"


def _note_on_span(route: str) -> None:
    observed = current_request()
    if observed is not None and observed.span is not None:
        observed.span.set_attribute(ROUTE_ATTRIBUTE, route)
        observed.span.set_attribute(REQUESTED_ATTRIBUTE, route)
