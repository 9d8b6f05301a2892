"""What a streamed or whole answer is relayed from: a job's chunks, live (`router.queue.run.JobRun`)
or held in memory once finished (`router.queue.held_answer.HeldAnswer`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from switchboard.wire import Chunk, Job


class ChunkSource(Protocol):
    """One job's chunks as `router.relay.first_byte.stream_response` and the whole-answer relay read
    them."""

    @property
    def job(self) -> Job:
        """The job whose chunks these are."""
        ...

    @property
    def served_model(self) -> str:
        """The model that wrote the chunks, as far as they told."""
        ...

    @property
    def ended(self) -> bool:
        """Whether the last chunk was handed out: no chunk is left to wait for."""
        ...

    @property
    def chunk_waiting(self) -> bool:
        """Whether the next chunk is here already: taking it would not wait (`router.relay.first_byte`
        writes the events of the chunks that are here together)."""
        ...

    @property
    def last_entry_id(self) -> str:
        """Where the last chunk handed out stands: the second half of a streamed event's `id:`."""
        ...

    def mark_resumable(self) -> None:
        """The chunks go to a streamed response, which its client may resume if the source allows."""
        ...

    async def wait_chunk(self, within_s: float) -> Chunk | None:
        """The next chunk, or None if `within_s` passes first or none is left."""
        ...

    def chunks(self, first: Chunk | None = None) -> AsyncIterator[Chunk]:
        """Every chunk (starting with `first`, if already taken) until the last."""
        ...

    async def close(self) -> None:
        """Stop reading the chunks. Idempotent."""
        ...
