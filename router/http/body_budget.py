"""The bytes of request bodies being read at once, bounded per API key and for the whole front door.

A body is held in memory while it is read, before anything that reads it can refuse it: 30
connections each holding an almost complete 9.5 MB body once took a front door from 71 to 344 MB.
So each read first reserves its body's bytes (its Content-Length; a chunked body's as they come)
against its key's budget (`router.max_body_bytes_in_flight_per_key`; every keyless caller shares
"anonymous") and the front door's (`router.max_body_bytes_in_flight`), and gives them back when the
read ends, however it ends. Past its key's budget a body is a 429, past the front door's a 503, both
with Retry-After and before the bytes are held; the connection, its body unread, is then closed
(`router.http.connections`). The largest body taken always fits a key that sends nothing else.
"""

from __future__ import annotations

from typing import Any

from litestar import Request

from router.openai.errors import KeyBodyBytesError, PayloadTooLargeError, ServerBodyBytesError
from switchboard.config import FrontDoorConfig

# Unset budgets, in bodies of the largest size taken: two per key, 32 for the front door (320 MiB at
# the default 10 MiB; a front door is given 1 GiB, and each body read is then decoded).
PER_KEY_BODIES = 2
TOTAL_BODIES = 32
# Retry-After of a refused body: reads end within the body deadlines, most within a second.
RETRY_AFTER_S = 1.0


class BodyBudget:
    """Bytes of the bodies being read, per key and in all; `reserve` before reading, `release` after."""

    def __init__(self, *, per_key: int, total: int) -> None:
        self.per_key = per_key
        self.total = total
        self.in_flight = 0
        self._by_key: dict[str, int] = {}

    @classmethod
    def of(cls, router: FrontDoorConfig) -> BodyBudget:
        """The router's budgets, those unset in bodies of its largest size."""
        return cls(
            per_key=router.max_body_bytes_in_flight_per_key or PER_KEY_BODIES * router.max_body_bytes,
            total=router.max_body_bytes_in_flight or TOTAL_BODIES * router.max_body_bytes,
        )

    def of_key(self, key: str) -> int:
        """Bytes of `key`'s bodies being read."""
        return self._by_key.get(key, 0)

    def reserve(self, key: str, size: int) -> None:
        """Hold `size` more bytes for `key`'s body, or refuse: 429 past the key's budget, 503 past the
        front door's."""
        held = self.of_key(key)
        if held + size > self.per_key:
            raise KeyBodyBytesError(
                f"This API key is already sending {held:,} bytes of request bodies; with this "
                f"{size:,}-byte body it would pass the {self.per_key:,} a key may send at once. "
                "Send fewer large bodies at once.",
                RETRY_AFTER_S,
            )
        if self.in_flight + size > self.total:
            raise ServerBodyBytesError(
                "The server is receiving as many request bytes as it takes at once.", RETRY_AFTER_S
            )
        self._by_key[key] = held + size
        self.in_flight += size

    def release(self, key: str, size: int) -> None:
        """Give back `size` bytes held for `key`."""
        held = self.of_key(key) - size
        if held > 0:
            self._by_key[key] = held
        else:
            self._by_key.pop(key, None)
        self.in_flight -= size


async def read_body(request: Request[Any, Any, Any], key: str) -> bytes:
    """The request's whole body, read within the body budgets of `key` (the caller's key name, or
    "anonymous") and of the front door.

    Raises PayloadTooLargeError (413) for a Content-Length past the largest body taken, before
    anything is held; KeyBodyBytesError (429) or ServerBodyBytesError (503) past a budget.
    """
    budget: BodyBudget = request.app.state.front_door.body_budget
    declared = request.content_length
    largest = request.route_handler.resolve_request_max_body_size()
    if declared is not None and largest is not None and declared > largest:
        raise PayloadTooLargeError(f"The request body is {declared:,} bytes; at most {largest:,} are taken.")
    reserved = declared or 0
    budget.reserve(key, reserved)
    try:
        chunks: list[bytes] = []
        received = 0
        async for chunk in request.stream():
            received += len(chunk)
            if received > reserved:  # a chunked body (or more than it declared): held as it comes
                budget.reserve(key, received - reserved)
                reserved = received
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        budget.release(key, reserved)
