"""Script calls of many concurrent callers, sent to Redis together: one write and one read per batch.

Each request of the front door runs a script when it is admitted and queued and another when it ends.
Called one by one, each call is a socket write of its own, a connection taken from the pool and given
back, and a reply read on its own: at 128 clients, a sixth of the front door's CPU was redis-py
sending commands. Here a call joins the calls waiting to go; the batch leaves the moment the one
before it has come back (a lone call leaves at once), as one pipeline, and each caller gets its own
reply or error. Nothing waits for a timer.

A batch runs as one transaction (MULTI/EXEC). Redis serves a client blocked on a key after each
command that touched it; in a plain pipeline, a worker blocked reading the job streams woke after
the first enqueue of a batch and found that job alone, then read again for the rest. In a
transaction the clients blocked on its keys wake once it has run whole, and read all of it at once.
Nothing is rolled back: a call that fails inside it fails alone, as before.

A call that Redis answers NOSCRIPT (it restarted, and lost its scripts) did not run: the batch's
`lua.ScriptRunner` loads its script and sends that call alone again. A call is never sent twice
otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from switchboard.lua import Calls, ScriptRunner

T = TypeVar("T")


class _Call:
    __slots__ = ("args", "keys", "reply", "script")

    def __init__(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> None:
        self.script = script
        self.keys = keys
        self.args = args
        self.reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()


async def answer(reply: asyncio.Future[T]) -> T:
    """A submitted call's reply (`ScriptBatch.submit`); its error raised. A caller cancelled meanwhile
    waits for the reply before it goes on cancelled, so that what the call took in Redis is given
    back after it was taken, not before."""
    try:
        return await asyncio.shield(reply)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await reply
        raise


class ScriptBatch:
    """Runs registered scripts (`switchboard.lua.register`) for many callers, batched per round trip."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._scripts = ScriptRunner(redis)
        self._waiting: list[_Call] = []
        self._sender: asyncio.Task[None] | None = None

    async def run(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """`script`'s reply for these KEYS and ARGV; its error raised. A caller cancelled meanwhile
        leaves its call to run: whoever needs its effect undone waits for it (`answer`)."""
        return await asyncio.shield(self.submit(script, keys, args))

    def submit(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> asyncio.Future[Any]:
        """Send the call with the next batch without waiting for it: its reply (or error), to come."""
        call = _Call(script, keys, args)
        self._waiting.append(call)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.ensure_future(self._send_while_waiting())
        return call.reply

    async def drain(self, timeout_s: float) -> None:
        """Wait, up to `timeout_s`, for every call submitted so far to be answered."""
        if self._sender is not None and not self._sender.done():
            await asyncio.wait([self._sender], timeout=timeout_s)

    async def _send_while_waiting(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                await self._send(batch)
            except BaseException as exc:
                for call in batch:
                    if not call.reply.done():
                        call.reply.set_exception(exc if isinstance(exc, Exception) else ConnectionError())
                if not isinstance(exc, Exception):
                    raise

    async def _send(self, batch: list[_Call]) -> None:
        def fill(calls: Calls) -> None:
            for call in batch:
                calls.add(call.script, call.keys, call.args)

        # A transaction: see the module's description.
        replies = await self._scripts.run(fill, transaction=True, raise_on_error=False)
        for call, reply in zip(batch, replies, strict=True):
            if call.reply.done():  # its caller was cancelled twice, and stopped waiting
                continue
            if isinstance(reply, Exception):
                call.reply.set_exception(reply)
            else:
                call.reply.set_result(reply)
