"""One reader's subscription to a job's results, as the front door's result reader (`router.queue.results`)
hands them out: the chunks in order, each with its entry id in the job's result stream."""

from __future__ import annotations

import asyncio

from switchboard import keys
from switchboard.wire import Chunk

# Where a job's results are read from when nothing of them was read yet.
START = "0-0"


def entry_order(entry_id: bytes) -> tuple[int, int]:
    """A result stream entry id (`<ms>-<seq>`) as something that sorts as Redis orders entries."""
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)


def skips_entries(last: tuple[int, int], entry: tuple[int, int]) -> bool:
    """Whether result entry `entry`, the first one read past `last`, leaves out entries between
    them. Chunks are entries `0-<position + 1>`; ids of another form are not judged."""
    return last[0] == 0 and entry[0] == 0 and entry[1] != last[1] + 1


class ResultsLost(Exception):
    """Redis lost the job (in a restart), or chunks of its results that its reader had not read."""


class Subscription:
    """The chunks of one job, each with its result stream entry id, in order."""

    def __init__(
        self, job_id: str, model: str, after: str = START, *, streamed: bool = False, from_inbox: bool = False
    ) -> None:
        self.job_id = job_id
        self.model = model
        # Whether its job's result stream is read itself (see the module's description); until when
        # (loop time) the inbox may bring nothing before it is.
        self.direct = not from_inbox
        self.quiet_at = 0.0
        # A streamed answer is kept a while after it was read to its end, for a client that resumes it.
        self.streamed = streamed
        self.stream_key = keys.result_stream(job_id).encode()
        self.last_id = after.encode()
        # Set once the job's last chunk was handed out: its result stream is no longer needed.
        self.finished = False
        # Set once the reader has read the job's last chunk (the caller may not have taken it yet).
        self.read_to_end = False
        # Entry id of the last chunk handed out (`after` for a stream resumed there).
        self.taken_id = after
        self.released = False
        # Set once its job is known to be in Redis (the enqueue returned, or the stream is resumed):
        # until then, a missing job record means only that it is on its way.
        self.queued = False
        # The model that writes the job's results, once its first chunk says (`keys.SERVED_BY_FIELD`):
        # another than `model` for a job moved to another model while it waited.
        self.served_by: str | None = None
        self._queue: asyncio.Queue[tuple[str, Chunk] | ResultsLost] = asyncio.Queue()

    @property
    def has_chunk(self) -> bool:
        """Whether a chunk (or the news that the results are lost) waits to be taken."""
        return not self._queue.empty()

    def deliver(self, entry_id: str, chunk: Chunk) -> None:
        """Called by the reader loop for every chunk read from the job's result stream."""
        self._queue.put_nowait((entry_id, chunk))

    def fail(self, error: ResultsLost) -> None:
        """Called by the reader loop when the job's results are gone for good."""
        self._queue.put_nowait(error)

    async def get(self, deadline: float) -> tuple[str, Chunk]:
        """The next chunk and its entry id; TimeoutError past `deadline` (loop time); ResultsLost."""
        if self._queue.empty():
            async with asyncio.timeout_at(deadline):
                item = await self._queue.get()
        else:
            item = self._queue.get_nowait()
        if isinstance(item, ResultsLost):
            raise item
        entry_id, chunk = item
        # Marked before the caller sees it: a caller that stops at the last chunk has not left early.
        self.finished = chunk.is_last
        self.taken_id = entry_id
        return item
