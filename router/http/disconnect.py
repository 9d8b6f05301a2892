"""A request whose client has gone away stops: its handler is cancelled, so its job ends at once.

ASGI servers do not stop a handler when its client disconnects; a non-streamed request would wait
for its job to the deadline, holding its key's parallel slot and the deployment's in-flight slot,
and the worker would generate for nobody. Once the handler has read the whole request body, this
middleware listens for the disconnect itself and cancels the handler, whose cleanup (`JobRun.close`:
a cancel mark, the slots released) then runs. Once a response has started, it is left alone: a
streamed response hears the disconnect itself, stops and closes its job.

A client that leaves before the last byte of its response is noted in the request's scope
(`router.telemetry.requests.client_left`): the error handlers and the request metrics then speak of a 499 (nginx's "client
closed request"), never of a 500, whatever the handler was doing when the body it read stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send

from router.relay.sse import ends_stream
from router.telemetry.requests import note_client_left

logger = logging.getLogger(__name__)


def cancel_on_disconnect(app: ASGIApp) -> ASGIApp:
    """Wrap `app` so that an HTTP request's handler is cancelled when its client disconnects."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        await _Request(app, scope, receive, send).run()

    return middleware


class _Request:
    """One HTTP request: the app runs in the server's task for it; a watcher cancels that task when
    the client leaves. (A task of its own for the app cost a turn of the event loop before every
    request started, and another as it ended.)"""

    def __init__(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        self._app = app
        self._scope = scope
        self._receive = receive
        self._send = send
        self._body_read = asyncio.Event()
        self._disconnected = asyncio.Event()
        self._response_started = False
        self._response_complete = False
        self._cancelled_by_watcher = False

    async def run(self) -> None:
        handler = asyncio.current_task()
        assert handler is not None, "an ASGI app runs in a task"
        watcher = asyncio.create_task(self._watch(handler))
        try:
            await self._app(self._scope, self._app_receive, self._app_send)
        except asyncio.CancelledError:
            if not self._cancelled_by_watcher:
                raise  # cancelled from outside (the server stopping), not by the watcher
            logger.debug("client disconnected; request cancelled", extra={"path": self._scope.get("path")})
        finally:
            if self._cancelled_by_watcher and handler.cancelling():
                # The server's task goes on (to close the connection): the watcher's cancel is spent.
                handler.uncancel()
            # No await since the app returned: the watcher cannot cancel the task any more.
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _app_receive(self) -> ReceiveMessage:
        if self._body_read.is_set():
            # The body is read: only a disconnect can come now, and the watcher receives it.
            await self._disconnected.wait()
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self._client_left()
        elif message["type"] == "http.request" and not message.get("more_body", False):
            self._body_read.set()
        return message

    async def _app_send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._response_started = True
        elif message["type"] == "http.response.body" and (
            not message.get("more_body", False) or ends_stream(message.get("body", b""))
        ):
            # A disconnect from now on is the end of an answer the client has whole: after the last
            # body, or after a stream's `[DONE]` (or a response's last event), which clients (the
            # openai SDK) close on at once, before the server's closing empty body.
            self._response_complete = True
        await self._send(message)

    async def _watch(self, handler: asyncio.Task[None]) -> None:
        await self._body_read.wait()
        message = await self._receive()
        if message["type"] != "http.disconnect":
            return
        self._client_left()
        # Once a response has started, the response itself hears the disconnect: a stream stops
        # and runs its cleanup. (Servers also answer `http.disconnect` once a response is complete.)
        if not self._response_started:
            self._cancelled_by_watcher = True
            handler.cancel()

    def _client_left(self) -> None:
        self._disconnected.set()
        if not self._response_complete:
            note_client_left(self._scope)
