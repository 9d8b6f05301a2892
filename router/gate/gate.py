"""A gate: what one endpoint's request body passes before anything else is done with it.

`Gate.passed` is the only way a handler reads its body: JSON only (415), read within the front
door's body budgets (413, 429, 503), decoded as the endpoint's request type (400 naming the field)
and checked against that type's bounds (400 naming the parameter and the bound). The handler
declares its gate on its route (`opt={"gate": GATE}`), and the app's request class refuses a body
read that no gate opened, so both the declaration and the passage are enforced, not remembered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec
from litestar import Request
from litestar.handlers import BaseRouteHandler

from router.admission.auth import caller_of
from router.gate.body import decoded, require_json
from router.http.body_budget import read_body
from router.openai.errors import PayloadTooLargeError
from switchboard.config import FrontDoorConfig

Body = TypeVar("Body")
Passed = TypeVar("Passed")

# Where a route declares its gate (Litestar's per-handler `opt`).
GATE_OPT = "gate"
# Set on the connection's state while a gate reads its body (`GatedRequest`).
_GATE_OPEN = "switchboard_gate_open"
GATE_OPEN_STATE = _GATE_OPEN


class DeclaredGate:
    """What a route declares as its body's only way in: a JSON body's `Gate`, or an upload's
    (`router.gate.upload.UploadGate`), which streams a multipart body to disk."""


@dataclass(frozen=True, eq=False)
class Gate(DeclaredGate, Generic[Body, Passed]):
    """One request type's passage: its decoder, the checks of its bounds, and what passes on."""

    # What the endpoint is called in messages ("chat completions").
    api: str
    decoder: msgspec.json.Decoder[Body]
    # The bounds of this type; returns what the handler goes on with (the checked ask).
    check: Callable[[Body, FrontDoorConfig], Passed]
    # A bound below the front door's `max_body_bytes` (the admin API's small bodies).
    max_bytes: int | None = None
    # What an empty body is read as (a load request's body may be empty); None: an empty body is
    # the JSON error it is.
    empty_as: bytes | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> Gate[Body, Passed]:
        # Litestar copies a route's `opt`; a gate is immutable and must stay the one declared.
        return self

    async def passed(self, request: Request[Any, Any, Any]) -> Passed:
        """The request's body, read, decoded and checked: what the handler goes on with."""
        if gate_of(request.route_handler) is not self:
            raise RuntimeError(f"{request.url.path}'s handler passes a gate its route does not declare")
        require_json(request)
        bounds: FrontDoorConfig = request.app.state.front_door.settings.router
        body = await self._read(request)
        if not body and self.empty_as is not None:
            body = self.empty_as
        return self.check(decoded(body, self.decoder), bounds)

    async def _read(self, request: Request[Any, Any, Any]) -> bytes:
        self._check_size(request.content_length)
        caller = await caller_of(request)
        request.state[_GATE_OPEN] = True
        try:
            # Counted against the key's and the front door's budgets of bodies in flight, by the key's
            # identity (its name may change; anonymous callers share one budget).
            body = await read_body(request, caller.owner or "anonymous")
        finally:
            request.state[_GATE_OPEN] = False
        self._check_size(len(body))
        return body

    def _check_size(self, size: int | None) -> None:
        if self.max_bytes is not None and size is not None and size > self.max_bytes:
            raise PayloadTooLargeError(
                f"The {self.api} body is {size:,} bytes; at most {self.max_bytes:,} are taken."
            )


def gate_of(handler: BaseRouteHandler) -> DeclaredGate | None:
    """The gate a route declares (None: its handler takes no body)."""
    gate = handler.opt.get(GATE_OPT)
    return gate if isinstance(gate, DeclaredGate) else None


def unchecked(body: Body, _: FrontDoorConfig) -> Body:
    """The check of a type whose every bound is its struct's own (msgspec's constraints)."""
    return body


class GatedRequest(Request[Any, Any, Any]):
    """The app's request: its body can be read only through a gate, so a handler that forgot to
    declare and pass one fails its first test (a 500) instead of taking unbounded bodies."""

    async def stream(self) -> Any:
        if not self.state.get(_GATE_OPEN, False):
            raise RuntimeError(
                f"{self.url.path}: a request body is read only through its route's gate (router.gate)"
            )
        async for chunk in super().stream():
            yield chunk
