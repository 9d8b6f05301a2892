"""Response bodies the handlers send as they are: JSON encoded by msgspec, and the health checks' body."""

from __future__ import annotations

import time

import msgspec
from litestar import Response
from litestar.response import Stream

_json = msgspec.json.Encoder()

# What an API handler answers: a whole JSON body, or a stream of server-sent events.
Answer = Response[bytes] | Stream


def json_response(
    payload: msgspec.Struct, status_code: int = 200, headers: dict[str, str] | None = None
) -> Response[bytes]:
    """A JSON response encoded with msgspec directly (no Litestar serialization pass)."""
    return Response(
        _json.encode(payload), status_code=status_code, media_type="application/json", headers=headers
    )


class Health(msgspec.Struct, kw_only=True):
    """Body of the health endpoints."""

    status: str
    workers: int | None = None
    # Of those, the ones with Triton running and their engines' runtime imported.
    workers_prepared: int | None = None
    # Per configured model: whether some live worker may hold it.
    models: dict[str, bool] | None = None
    time: float = msgspec.field(default_factory=time.time)
