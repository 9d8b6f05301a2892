"""The tokens a request's earlier steps spent (a router's choice, a cascade's draft not kept), added to
its answer's usage, so that the usage a client reads counts everything the request cost."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import msgspec

from switchboard.wire import Chunk, Usage

if TYPE_CHECKING:
    from router.queue.run import JobRun


class Spent:
    """The tokens earlier steps of a request spent (a router's choice, a draft not kept), added to
    the answer's usage so that it counts all the request cost."""

    def __init__(self) -> None:
        self.usage: Usage | None = None

    def add(self, usage: Usage | None) -> None:
        if usage is None:
            return
        self.usage = usage if self.usage is None else _sum(self.usage, usage)


def usage_of(chunks: list[Chunk]) -> Usage | None:
    """The usage a finished job's chunks report (on its last chunk)."""
    return next((chunk.usage for chunk in reversed(chunks) if chunk.usage is not None), None)


class SpentBefore:
    """A live run whose answer's usage also counts what earlier steps of its request spent (a
    router's choice, a draft not kept): the usage on its last chunk gains `spent`."""

    def __init__(self, run: JobRun, spent: Usage) -> None:
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
    def last_entry_id(self) -> str:
        return self._run.last_entry_id

    def mark_resumable(self) -> None:
        self._run.mark_resumable()

    async def wait_chunk(self, within_s: float) -> Chunk | None:
        return await self._run.wait_chunk(within_s)

    def chunks(self, first: Chunk | None = None) -> AsyncIterator[Chunk]:
        return with_usage_added(self._run.chunks(first), self._spent)

    async def close(self) -> None:
        await self._run.close()


async def with_usage_added(chunks: AsyncIterator[Chunk], extra: Usage | None) -> AsyncIterator[Chunk]:
    """A live run's chunks, its last one's usage counting `extra` too (a rejected draft's tokens)."""
    async for chunk in chunks:
        yield usage_added(chunk, extra)


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
