"""The tokens a request's earlier steps spent (a router's choice, a cascade's draft not kept), added to
its answer's usage, so that the usage a client reads counts everything the request cost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any

import msgspec

from switchboard.wire import Chunk, Usage

if TYPE_CHECKING:
    from router.queue.run import JobRun


class Spent:
    """The tokens earlier steps of a request spent (a router's choice, a draft not kept), added to
    the answer's usage so that it counts all the request cost. A step stopped early (a router whose
    label was known) tells its usage later, when its job's end is read: `add_later`."""

    # How long an answer's end waits for the usage of a step stopped early (it comes within
    # milliseconds: the engine stops at the cancel mark and writes the job's end).
    SETTLE_S = 2.0

    def __init__(self) -> None:
        self.usage: Usage | None = None
        self._pending: set[asyncio.Task[Usage | None]] = set()

    @property
    def nothing(self) -> bool:
        """Whether nothing was, or is about to be, spent."""
        return self.usage is None and not self._pending

    def add(self, usage: Usage | None) -> None:
        if usage is None:
            return
        self.usage = usage if self.usage is None else _sum(self.usage, usage)

    def add_later(self, usage: Coroutine[Any, Any, Usage | None]) -> None:
        """Count the usage `usage` gives once it does (run in the background meanwhile)."""
        task = asyncio.create_task(usage)
        self._pending.add(task)
        task.add_done_callback(self._settled)

    def _settled(self, task: asyncio.Task[Usage | None]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is None:
            self.add(task.result())

    async def settled(self) -> Usage | None:
        """Everything spent, once what was to be told later is in (or `SETTLE_S` has passed)."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=self.SETTLE_S)
        return self.usage


def usage_told(chunks: list[Chunk]) -> Usage | None:
    """The usage a finished job's chunks report (on its last chunk)."""
    return next((chunk.usage for chunk in reversed(chunks) if chunk.usage is not None), None)


class SpentBefore:
    """A live run whose answer's usage also counts what earlier steps of its request spent (a
    router's choice, a draft not kept): the usage on its last chunk gains `spent`'s, settled."""

    def __init__(self, run: JobRun, spent: Spent) -> None:
        self._run = run
        self._spent = spent
        self.job = run.job

    @property
    def served_model(self) -> str:
        return self._run.served_model

    @property
    def ended(self) -> bool:
        return self._run.ended

    @property
    def chunk_waiting(self) -> bool:
        return self._run.chunk_waiting

    @property
    def last_entry_id(self) -> str:
        return self._run.last_entry_id

    def mark_resumable(self) -> None:
        self._run.mark_resumable()

    async def wait_chunk(self, within_s: float) -> Chunk | None:
        return await self._run.wait_chunk(within_s)

    async def chunks(self, first: Chunk | None = None) -> AsyncIterator[Chunk]:
        async for chunk in self._run.chunks(first):
            yield chunk if chunk.usage is None else usage_added(chunk, await self._spent.settled())

    async def close(self) -> None:
        await self._run.close()


def usage_added(chunk: Chunk, extra: Usage | None) -> Chunk:
    """`chunk`, its usage (if it carries one: the job's last chunk) counting `extra` too."""
    if chunk.usage is None or extra is None:
        return chunk
    return msgspec.structs.replace(chunk, usage=_sum(chunk.usage, extra))


def _sum(usage: Usage, more: Usage) -> Usage:
    return Usage(
        prompt_tokens=usage.prompt_tokens + more.prompt_tokens,
        completion_tokens=usage.completion_tokens + more.completion_tokens,
    )
