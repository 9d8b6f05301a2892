"""A non-streamed request whose client leaves is cancelled, as a streamed one is.

An ASGI server does not cancel a handler when its client disconnects; it reports the disconnect to
whoever waits on `receive()`. Once the body has been read, nothing else waits there, so a watcher
can: when the client goes, the work is cancelled, and the job's run leaves its cancel mark.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from litestar import Request

from router.openai.errors import OpenAIError

T = TypeVar("T")


class ClientDisconnectedError(OpenAIError):
    """The client left before its answer was ready (nobody reads this response)."""

    # nginx's "client closed request": the status proxies log for it.
    status_code = 499
    error_type = "invalid_request_error"
    default_code = "client_disconnected"


async def unless_disconnected(request: Request[Any, Any, Any], work: Awaitable[T]) -> T:
    """The result of `work`, cancelled if the client disconnects first (its body already read)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, watcher):
            pending.cancel()
        # Let the work's own cleanup run before the caller's (the job's run leaves its cancel mark).
        await asyncio.gather(task, watcher, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnectedError("The client disconnected before its answer was ready.")
    return task.result()


async def _disconnect(request: Request[Any, Any, Any]) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
