"""An answer held in memory: a finished job's chunks, relayed as a live run's would be.

A cascade reads its draft whole before it decides whether the client gets it
(`router.routing.pipelines.cascade`), so a draft it keeps is no longer a job being read: it is a list of
chunks. `HeldAnswer` hands them to the stream and whole-answer relays through the same surface as
`router.queue.run.JobRun` (`router.queue.chunk_source.ChunkSource`), so that the client gets the same
events as from the live job.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from router.queue.chunk_source import ChunkSource
from switchboard.wire import Chunk, Job


class HeldAnswer:
    """The chunks of a finished job, handed out at once from memory.

    Not resumable: the job's run was closed once it was read, so a client that loses its connection
    does not come back for the rest of a held answer; it sends its request again. `mark_resumable`
    changes nothing, and its events' `id:` lines (`<job id>:0-<position>`, the chunk's position
    from 1) name no entry of any result stream: a resume from one is refused with a 400 that says to
    send the request again, never answered from another point of some stream.
    """

    def __init__(self, job: Job, chunks: Sequence[Chunk], *, served_model: str) -> None:
        self._job = job
        self._chunks = tuple(chunks)
        self._served_model = served_model
        self._taken = 0  # chunks handed out so far

    @property
    def job(self) -> Job:
        return self._job

    @property
    def served_model(self) -> str:
        """The model that wrote the chunks (the one its run named when it was read)."""
        return self._served_model

    @property
    def ended(self) -> bool:
        """Whether every chunk was handed out."""
        return self._taken >= len(self._chunks)

    @property
    def chunk_waiting(self) -> bool:
        """Whether a chunk is left: every one is here."""
        return not self.ended

    @property
    def last_entry_id(self) -> str:
        """The position of the chunk handed out last, from 1, as a stream entry id in the ms-0 range
        that no real entry has ("0-0", before any, means a stream's start to a resume)."""
        return f"0-{self._taken}"

    def mark_resumable(self) -> None:
        """Nothing: a held answer is not kept for a client that comes back."""

    async def wait_chunk(self, within_s: float) -> Chunk | None:
        """The next chunk at once, or None when none is left."""
        return self._take()

    async def chunks(self, first: Chunk | None = None) -> AsyncIterator[Chunk]:
        """`first` (already taken, if given), then every chunk not yet handed out, up to the last."""
        chunk = first if first is not None else self._take()
        while chunk is not None:
            yield chunk
            if chunk.is_last:
                return
            chunk = self._take()

    async def close(self) -> None:
        """Nothing to release: the job's run was closed once its chunks were read."""

    def _take(self) -> Chunk | None:
        if self.ended:
            return None
        self._taken += 1
        return self._chunks[self._taken - 1]


async def collect(run: ChunkSource, within_s: float) -> list[Chunk] | None:
    """Every chunk of `run` up to its last, or None if `within_s` passes first (the caller then
    closes the run, which cancels the job). The run's errors (its deadline, lost results) propagate;
    a job that failed ends with its error chunk, which is returned as any last chunk."""
    loop = asyncio.get_running_loop()
    limit = loop.time() + within_s
    chunks: list[Chunk] = []
    while not chunks or not chunks[-1].is_last:
        left_s = limit - loop.time()
        chunk = await run.wait_chunk(left_s) if left_s > 0 else None
        if chunk is None:
            return None
        chunks.append(chunk)
    return chunks
