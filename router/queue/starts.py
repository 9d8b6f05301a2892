"""Where a request's job run begins: queued afresh (admitted and enqueued in one round trip), or picked
up again by a client that resumes its stream with `Last-Event-ID` (no new job is queued, but the
reader is admitted against its key's limits all the same).

Whatever stops a start on its way (an error, its client leaving) gives its admission ticket back,
and a job that may have been queued for nobody is cancelled. The run itself is `router.queue.run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import msgspec
from redis.exceptions import RedisError

from router.admission.auth import Caller
from router.admission.charges import Charge, DeliveredShare
from router.admission.limits import Admission, Admitting, Ticket
from router.admission.model_table import require_live_worker
from router.openai.errors import InvalidRequestError, ModelLoadFailedError, StreamNotFoundError
from router.queue.enqueue import JobQueue, Resumption, UnknownEntry, admitted
from router.queue.results import ResultReader
from router.queue.run import JobRun
from router.queue.subscription import Subscription
from router.status.model_status import ModelStatusReader
from router.telemetry.job_observer import FrontDoorJobObserver
from router.telemetry.rollout_observations import Observations
from switchboard import keys
from switchboard.config import FrontDoorConfig
from switchboard.lua.batched import answer
from switchboard.wire import Chunk, Job

logger = logging.getLogger(__name__)


class NothingDelivered:
    """The charge of a resumed stream whose client already had the answer's end: it relays no chunk."""

    tokens = 0

    def chunk(self, chunk: Chunk) -> None:
        """Never called: the run hands out no chunk."""


class JobRuns:
    """Starts the runs of this front door's jobs: queued afresh, or resumed after a lost connection."""

    def __init__(
        self,
        queue: JobQueue,
        reader: ResultReader,
        status: ModelStatusReader,
        settings: FrontDoorConfig,
        router_id: str,
        admission: Admission,
        observations: Observations,
    ) -> None:
        self._queue = queue
        self._reader = reader
        self._status = status
        self._settings = settings
        self._admission = admission
        # What a running rollout is judged on: every job observed here counts (`FrontDoorJobObserver`).
        self.observations = observations
        # Every job names the front door waiting for it (`router.status.heartbeat`).
        self.router_id = router_id

    async def queued(self, job: Job, caller: Caller) -> JobRun:
        """`job` admitted for `caller` and queued: 429 at a limit; 503 with Retry-After for a model no
        live worker may hold, or whose last load failed. The caller must `close()` the run."""
        # Sent with the caller's key, and waited for by this front door.
        job = msgspec.structs.replace(job, tenant=caller.name, router_id=self.router_id)
        await require_live_worker(self._status, job.model)
        observer = FrontDoorJobObserver(job, self.observations)
        with observer.phase("switchboard.admission"):
            # Admitted in the enqueue's round trip (`start`): here only what it will send.
            admitting = self._admission.admitting(job, caller)
        return await self.start(job, admitting, observer)

    async def resumed(self, job: Job, caller: Caller, after: str) -> tuple[JobRun, list[Chunk]]:
        """The rest of a stream whose client lost its connection, and what it had (`resume`). A resume
        is a request: admitted against its key's limits first (429, and nothing of the job read or
        counted, when refused)."""
        observer = FrontDoorJobObserver(job, self.observations, resumed=True)
        with observer.phase("switchboard.admission"):
            ticket = await self._admission.admit_resume(job, caller)
        return await self.resume(job, ticket, after, observer)

    async def start(self, job: Job, admitting: Admitting, observer: FrontDoorJobObserver) -> JobRun:
        """Admit `job` and enqueue it in one round trip, and start reading its results; the caller must
        `close()` what it gets. A 429 when admission refuses it; a model whose last load failed takes
        no job: a 503 with Retry-After at once.

        Whatever stops it on its way (an error, its client leaving) gives the ticket back, and a job
        that may have been queued for nobody is cancelled.
        """
        # Its chunks come to this front door's inbox: the reader need not be woken for it.
        subscription = self._reader.subscribe(job.id, job.model, from_inbox=True)
        ticket = admitting.ticket
        try:
            with observer.phase("switchboard.enqueue"):
                # The job is its key's, by the key's identity: only that key may resume its stream.
                reply = self._queue.send_admitted(observer.traced(job), admitting, owner=ticket.caller.owner)
                failure = admitted(await answer(reply), admitting)
            if failure is not None:
                raise ModelLoadFailedError(job.model, failure.reason, failure.retry_at - time.time())
            subscription.queued = True
        except BaseException as exc:
            observer.closed(finished=False)
            self._reader.unsubscribe(subscription)
            # Shielded: a client that left cancels this task, and the slots must still be given back.
            left = isinstance(exc, asyncio.CancelledError)
            await asyncio.shield(self._abandon(job.id, ticket, cancel=left))
            raise
        return self._run(job, subscription, ticket, observer)

    async def resume(
        self, job: Job, ticket: Ticket, after: str, observer: FrontDoorJobObserver
    ) -> tuple[JobRun, list[Chunk]]:
        """The rest of `job`'s results, from after entry `after` (a stream resumed with
        `Last-Event-ID`), for the admitted reader holding `ticket`, and the chunks up to it, which the
        client had. A 404 if its result stream is gone, or the job was sent with another key than
        the ticket's; a 400 if `after` is no entry of it. No new job is queued. Whatever refuses the
        reader gives its ticket back, and counts it as no reader of the job."""
        try:
            found = await self._earlier_chunks(job.id, after, owner=ticket.caller.owner)
        except BaseException:
            observer.closed(finished=False)
            await asyncio.shield(self._abandon(job.id, ticket, cancel=False))
            raise
        earlier = found.earlier
        if found.model is not None and found.model != job.model:
            # The model the job was queued for: a route's weights may place its caller elsewhere now.
            job = msgspec.structs.replace(job, model=found.model)
        if earlier and earlier[-1].is_last:
            # The client had the answer's last event (it lost only what followed, maybe `[DONE]`):
            # nothing is left to read, and waiting for more would hold it until the deadline.
            ended = self._reader.subscribe_ended(job.id, job.model, after)
            return self._run(job, ended, ticket, observer, NothingDelivered()), earlier
        subscription = self._reader.subscribe(job.id, job.model, after, streamed=True, queued=True)
        if self._reader.blocked:
            # Without the poke, the reader's next pass (within BLOCK_MS) picks the subscription up.
            with contextlib.suppress(RedisError):
                await self._reader.wake()
        return self._run(job, subscription, ticket, observer, DeliveredShare(earlier)), earlier

    async def _earlier_chunks(self, job_id: str, after: str, *, owner: str) -> Resumption:
        """The chunks of job `job_id` up to entry `after` (and the model it was queued for), counting
        one more reader of it; a 404 or a 400 (counting nobody) for a job whose results are gone or
        are another key's, or an `after` that is no entry of them."""
        try:
            found = await self._queue.resume(job_id, after, owner=owner)
        except UnknownEntry:
            raise InvalidRequestError(
                f"Last-Event-ID {job_id}:{after} names no event of that answer. Send the `id:` of the "
                "last event received, or send the request again without Last-Event-ID.",
                code="invalid_last_event_id",
            ) from None
        if found is None:
            # Another key's job reads as an unknown one: its existence is not revealed.
            raise StreamNotFoundError(
                f"No results of job {job_id} are kept for this key: it is unknown, its results "
                f"expired ({keys.RESULT_TTL_S} s after their last chunk, {keys.FINISHED_RESULT_TTL_S} s "
                "after a stream was read to its end, at once when its client did not come back "
                "within the resume grace), or it was sent with another API key. Send the request "
                "again without Last-Event-ID."
            )
        return found

    def _run(
        self,
        job: Job,
        subscription: Subscription,
        ticket: Ticket,
        observer: FrontDoorJobObserver,
        charge: Charge | None = None,
    ) -> JobRun:
        return JobRun(
            job,
            subscription,
            reader=self._reader,
            queue=self._queue,
            status=self._status,
            timeout_s=self._settings.request_timeout_s,
            ticket=ticket,
            resume_grace_s=self._settings.resume_grace_s,
            observer=observer,
            charge=charge,
        )

    async def _abandon(self, job_id: str, ticket: Ticket, *, cancel: bool) -> None:
        """Give back the ticket of a request that nobody waits for (nothing was delivered for it)."""
        try:
            if cancel:
                await self._queue.cancel(job_id)
            await ticket.release(0)
        except RedisError:
            logger.warning("could not release the job's admission slots", extra={"job_id": job_id})
