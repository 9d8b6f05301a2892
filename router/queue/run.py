"""One enqueued job as its request handler sees it, once queued (or picked up again by a client that
resumes its stream; both begin in `router.queue.starts`): its chunks until its deadline, then its
cleanup.

The chunks come from the process's one result reader (`router.queue.results`); nothing here reads Redis
while chunks arrive in time. Only a deadline that passes before the first chunk reads where the
model stands, to tell the client what the job waited for: a load (and when to come back), a worker
to be alive at all, or a place in a busy queue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from redis.exceptions import RedisError

from router.admission.charges import Charge, UsedTokens
from router.admission.limits import Ticket
from router.admission.model_table import NO_WORKER_RETRY_S, WORKERS_MAX_AGE_S
from router.openai.errors import (
    JobTimeoutError,
    ModelLoadingError,
    NoWorkerAliveError,
    OpenAIError,
    ResultsLostError,
)
from router.queue.enqueue import JobQueue
from router.queue.results import ResultReader
from router.queue.subscription import START, ResultsLost, Subscription
from router.status.model_status import ModelStatusReader, may_serve
from router.telemetry.job_observer import FrontDoorJobObserver
from switchboard.wire import Chunk, Job

logger = logging.getLogger(__name__)
# Retry-After for a request dropped while its model loads, when no load time is known at all.
UNKNOWN_LOAD_RETRY_S = 30.0
# Retry-After for a request whose job a Redis restart lost.
LOST_RETRY_S = 1.0


class JobRun:
    """The chunks of one enqueued job; `close()` ends it, leaving a cancel mark if it is unfinished.

    A streamed run (`mark_resumable`) that ends mid-stream keeps its result stream, and the job
    waits `resume_grace_s` for a client that resumes the stream (`Last-Event-ID`), maybe through
    another front door; past that with no reader it is given up: cancelled, and its results deleted
    at once. One read to its end keeps them `keys.FINISHED_RESULT_TTL_S`.
    """

    def __init__(
        self,
        job: Job,
        subscription: Subscription,
        *,
        reader: ResultReader,
        queue: JobQueue,
        status: ModelStatusReader,
        timeout_s: float,
        ticket: Ticket | None,
        resume_grace_s: float = 0.0,
        observer: FrontDoorJobObserver | None = None,
        charge: Charge | None = None,
    ) -> None:
        self.job = job
        self._subscription = subscription
        self._reader = reader
        self._queue = queue
        self._status = status
        self._timeout_s = timeout_s
        self._ticket = ticket
        self._resume_grace_s = resume_grace_s
        self._observer = observer
        self.resumable = False
        # What its key's tpm and token quotas are settled with once it ends (`router.admission.charges`).
        self._charge = charge or UsedTokens()
        # The job's deadline on the event loop's clock, which timeouts use.
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + (job.deadline - time.time())
        self.started = False  # a chunk has arrived
        self._closed = False

    def mark_resumable(self) -> None:
        """The run's chunks go to a streamed response, which its client may resume."""
        self.resumable = True
        self._subscription.streamed = True

    @property
    def chunk_waiting(self) -> bool:
        """Whether the next chunk was read already: taking it would not wait."""
        return self._subscription.has_chunk

    @property
    def last_entry_id(self) -> str:
        """The result stream entry id of the last chunk handed out: where a resumed stream goes on."""
        return self._subscription.taken_id

    @property
    def served_model(self) -> str:
        """The model that writes the job's results, as far as its chunks told: the job's own, unless
        it was moved to another while it waited (`router.queue.move_waiting`)."""
        return self._subscription.served_by or self.job.model

    @property
    def ended(self) -> bool:
        """Whether the job's last chunk was handed out (or, for a resumed stream, its client had it):
        no chunk is left to wait for."""
        return self._subscription.finished

    async def wait_chunk(self, within_s: float) -> Chunk | None:
        """The next chunk, or None if `within_s` passes first or none is left (`ended`); the deadline's
        error if that passes first."""
        if self.ended:
            return None
        limit = min(asyncio.get_running_loop().time() + within_s, self._deadline)
        return await self._next(limit, before_deadline=limit < self._deadline)

    async def chunks(self, first: Chunk | None = None) -> AsyncIterator[Chunk]:
        """Every chunk (starting with `first`, if already taken) until the last; the deadline's error."""
        if first is None and self.ended:
            return
        chunk = first
        while chunk is None or not chunk.is_last:
            if chunk is not None:
                yield chunk
            chunk = await self._next(self._deadline, before_deadline=False)
        yield chunk

    async def stop_generating(self) -> None:
        """Ask the worker to stop generating (a cancel mark), and go on reading: the job's end, with
        its usage, still comes. For a step whose answer was known before it ended."""
        if not self.ended:
            await self._queue.cancel(self.job.id)

    async def close(self) -> None:
        """Stop reading the job's results; an unfinished job gets a cancel mark; its admission ticket
        is released. Idempotent."""
        if self._closed:
            return
        self._closed = True
        unfinished = not self._subscription.finished
        if self._observer is not None:
            self._observer.closed(finished=not unfinished)
        # A client that saw part of a stream may come back for the rest: keep it for the grace.
        resumable = unfinished and self.resumable and self._subscription.taken_id != START
        self._reader.unsubscribe(self._subscription, keep=resumable)
        if not unfinished and not self._release_waits:
            # Nothing to wait for: the answer leaves now, without a task and the turns of the event
            # loop it would take (under load each turn is other requests' work).
            if self._ticket is not None:
                self._ticket.release_soon(self._charge.tokens)
            return
        # Shielded: a client that left cancels this task, and the mark and the release must still happen.
        await asyncio.shield(self._finish(left=unfinished, resumable=resumable))

    @property
    def _release_waits(self) -> bool:
        """Whether the answer waits for the ticket's release (`Ticket.answer_waits_for_release`)."""
        return self._ticket is not None and self._ticket.answer_waits_for_release

    async def _next(self, limit: float, *, before_deadline: bool) -> Chunk | None:
        try:
            _, chunk = await self._subscription.get(limit)
        except ResultsLost:
            raise ResultsLostError(self.job.id, LOST_RETRY_S) from None
        except TimeoutError:
            if before_deadline:
                return None
            raise await self._deadline_error() from None
        self.started = True
        if self._observer is not None:
            self._observer.chunk(chunk)
        self._charge.chunk(chunk)
        return chunk

    async def _deadline_error(self) -> OpenAIError:
        """What the job waited for when its deadline passed: a 504 once it started, or while a worker
        could have started it (its model warm, or workers alive that loaded nothing); a 503 while its
        model loads (as heartbeats tell, or claimed by a worker whose heartbeat does not tell yet),
        or when no live worker may hold it."""
        if self.started:
            return JobTimeoutError(
                f"The job did not finish within {self._timeout_s:g} s. "
                "Retry later, or raise router.request_timeout_s."
            )
        queued = JobTimeoutError(
            f"The job waited {self._timeout_s:g} s in the queue of model `{self.job.model}` and no "
            "worker started it. Retry later, or raise router.request_timeout_s."
        )
        try:
            status = await self._status.read_one(self.job.model)
            cold = status.state == "cold"
            workers = await self._status.live_workers(WORKERS_MAX_AGE_S) if cold else []
            claimed = cold and await self._queue.load_claimed(self.job.model)
        except RedisError:
            logger.warning("could not read the model's status", extra={"model": self.job.model})
            return queued
        if status.state == "warm":
            return queued
        if cold and not may_serve(workers, self.job.model):
            logger.info(
                "request dropped: no live worker", extra={"model": self.job.model, "job_id": self.job.id}
            )
            return NoWorkerAliveError(self.job.model, self._timeout_s, NO_WORKER_RETRY_S)
        if cold and not claimed:
            return queued  # workers alive, none of them started loading it
        remaining_s = status.load_remaining_s()
        logger.info(
            "request dropped while its model loads",
            extra={"model": self.job.model, "job_id": self.job.id, "remaining_s": remaining_s},
        )
        return ModelLoadingError(
            self.job.model,
            # Claimed, asleep or on its way out, it is on its way back: the controller sees the job.
            loading=True,
            typical_load_s=status.typical_load_s(),
            retry_after_s=UNKNOWN_LOAD_RETRY_S if remaining_s is None else remaining_s,
        )

    async def _finish(self, *, left: bool, resumable: bool) -> None:
        if left:
            # At once rather than on the reader's next pass, which a blocked read may hold back.
            try:
                await self._leave(resumable=resumable)
            except RedisError:
                logger.warning("could not leave a cancel mark", extra={"job_id": self.job.id})
        if self._ticket is None:
            return
        if not self._release_waits:
            # The answer goes now; the release leaves with the next batch. Waiting for it held every
            # answer a batch's round trip longer (a third of the front door's part of an embedding's
            # time at 128 clients, measured), and each client's next request with it.
            self._ticket.release_soon(self._charge.tokens)
            return
        try:
            await self._ticket.release(self._charge.tokens)
        except RedisError:
            # Its slots expire on their own past the job's deadline.
            logger.warning("could not release the job's admission slots", extra={"job_id": self.job.id})

    async def _leave(self, *, resumable: bool) -> None:
        """Tell the job's other parts that this reader left before its end."""
        if not resumable:
            await self._queue.leave(self.job.id)
            return
        leaves = await self._queue.step_away(self.job.id)
        if self._resume_grace_s > 0:
            self._queue.give_up_later(self.job.id, leaves=leaves, after_s=self._resume_grace_s)
        else:
            await self._queue.give_up(self.job.id, leaves=leaves)
