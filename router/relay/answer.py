"""A job's answer to its client: streamed as server-sent events, or whole once the job has finished.
A client that leaves cancels the job either way (`router.http.disconnect`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from router.http.answers import Answer, json_response
from router.queue.chunk_source import ChunkSource
from router.relay.answer_relays import AnswerRelay
from router.relay.first_byte import StreamForm, stream_response
from router.status.model_status import ModelStatusReader
from switchboard.config import FrontDoorConfig
from switchboard.wire import Chunk


@dataclass(frozen=True, slots=True)
class Relaying:
    """How this front door answers: its first-byte budget and progress comments (`settings`), and
    where a waiting stream's progress is read (`status`)."""

    settings: FrontDoorConfig
    status: ModelStatusReader

    async def answer(self, run: ChunkSource, relay: AnswerRelay, *, stream: bool, form: StreamForm) -> Answer:
        """The run's answer, streamed or whole; the run is closed when it is written."""
        if stream:
            return await stream_response(run, relay, self.settings, self.status, form)
        try:
            return json_response(await relay.assemble(served_chunks(run, relay)))
        finally:
            await run.close()


async def served_chunks(run: ChunkSource, relay: AnswerRelay) -> AsyncIterator[Chunk]:
    """The run's chunks, the relay naming the model that writes them (`JobRun.served_model`)."""
    async for chunk in run.chunks():
        relay.model = run.served_model
        yield chunk
