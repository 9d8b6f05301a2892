"""One job taken by the consumer: run it through its model's Triton model, relay its chunks.

A job put back in line is first planned against what its client already has (`continuation`); a
fresh one goes to the engine at once. Its chunks go to the result writer in order, the last one
acknowledging the job; a job whose client left is aborted in the engine and acknowledged, and a
job that fails is answered with an error (or, when even that cannot be written, left pending for
a takeover).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator

import msgspec
import redis.asyncio as aioredis

from switchboard.tasks import cancel_and_wait
from switchboard.wire import Chunk, JobError, Usage, chunk_decoder, encode
from workers.jobs.continuation import LeftChecks, Plan, plan
from workers.jobs.observer import WorkerJobObserver, current_job, note_outcome
from workers.jobs.orphans import OrphanWatch
from workers.jobs.takeover import Entry, acknowledge
from workers.jobs.writer import ResultWriter, Superseded, inbox_of
from workers.models.slot import Lease, ModelSlot
from workers.triton.engine_job import EngineJob

logger = logging.getLogger(__name__)


class ChunkNotWritten(RuntimeError):
    """Redis refused a chunk of the job even after retries; the job is left for a takeover."""


class JobRunner:
    """Runs the jobs one worker took, each on the model slot leased for it."""

    def __init__(
        self, redis: aioredis.Redis, writer: ResultWriter, *, worker_id: str, orphans: OrphanWatch
    ) -> None:
        self._redis = redis
        self._writer = writer
        self._worker_id = worker_id
        self._orphans = orphans
        self._left_checks = LeftChecks(redis)

    async def run(self, entry: Entry, slot: ModelSlot, lease: Lease) -> None:
        """Run one job on `slot`, which `lease` holds for it; the lease is released at its end."""
        observer = WorkerJobObserver.taken(entry, self._worker_id, slot)
        try:
            await self._run_leased_job(entry, slot, lease)
        except Exception:
            # Left pending and no longer running here, the job is put back in line by a sweep.
            logger.exception("a job could not be run", extra={"job_id": entry.job.id})
        finally:
            lease.release()
            observer.ended()

    async def _run_leased_job(self, entry: Entry, slot: ModelSlot, lease: Lease) -> None:
        job = entry.job
        # A fresh job goes to the engine at once; whether its client left while it waited is
        # asked meanwhile (a round trip off the time to first token) and answered before its
        # first chunk is written. Only a job put back in line needs its stream read first.
        where = await plan(self._redis, job) if entry.requeued else RUN
        if where.action == "skip":
            # Its client has gone, or already has the whole answer: nothing is written.
            note_outcome("skipped")
            await acknowledge(self._redis, entry.stream, entry.entry_id, job.id)
            return
        fresh = where.action == "run"
        if time.time() > job.deadline:
            # Its client has had its answer (a timeout) already: the job must never run late.
            note_outcome("expired")
            await self.fail(
                entry,
                JobError(code="timeout", message="the job expired before a worker took it"),
                create=fresh,
            )
            return
        if where.error is not None:
            await self.fail(entry, where.error, create=False)
            return
        payload = entry.payload
        if where.action == "continue_":
            payload = encode(EngineJob(**msgspec.structs.asdict(job), continuation=where.continuation))
            logger.info("continuing a job taken over", extra={"job_id": job.id, "taken": entry.taken_before})
        self._orphans.track(job, abort=lambda: _abort(slot, job.id))
        # A pooling job is answered in milliseconds, in one write that tells anyway whether its
        # client left: asking first would cost a round trip per job (5 % of the worker's loop).
        asks = not entry.requeued and job.pooling is None
        left = asyncio.ensure_future(self._left_while_queued(job.id, slot)) if asks else None
        try:
            finished = await self._stream_job(entry, payload, slot, lease, sent=where.sent, left=left)
        except Superseded:
            # This worker stalled past its heartbeat and another took the job over: that one
            # answers it, and acknowledges it at its end.
            note_outcome("superseded")
            logger.warning("job taken over by another worker; stopped here", extra={"job_id": job.id})
            return
        except ChunkNotWritten:
            # Writing its error would fail as well: the job stays pending, and a sweep puts it
            # back in line once it has been idle for the heartbeat TTL; then it is continued.
            logger.exception(
                "a chunk could not be written; the job is left for a takeover", extra={"job_id": job.id}
            )
            return
        except Exception:
            logger.exception("job failed", extra={"job_id": job.id, "model": job.model})
            message = f"The worker failed while running job {job.id}; its log has the reason."
            await self.fail(entry, JobError(code="engine_error", message=message), create=False)
            return
        finally:
            self._orphans.untrack(job.id)
            if left is not None:
                await cancel_and_wait(left)
        if not finished:
            await self.fail(
                entry,
                JobError(code="engine_error", message="the engine ended without a result"),
                create=False,
            )

    async def _left_while_queued(self, job_id: str, slot: ModelSlot) -> bool:
        """Whether the client of a job just sent to the engine left while the job waited in line;
        if so, the job is aborted, there or on its way."""
        # One turn of the loop first: the job's request goes out to Triton before this question's
        # Redis command, whose sending the first token would otherwise wait behind.
        await asyncio.sleep(0)
        try:
            left = await self._left_checks.client_left(job_id)
        except Exception:
            # The first chunk's write meets the same Redis and says whether the client is there.
            logger.warning("could not read whether a job's client is still there", extra={"job_id": job_id})
            return False
        if left:
            await _abort(slot, job_id, arriving=True)
        return left

    async def _stream_job(
        self,
        entry: Entry,
        payload: bytes,
        slot: ModelSlot,
        lease: Lease,
        *,
        sent: int,
        left: asyncio.Future[bool] | None = None,
    ) -> bool:
        """Relay the engine's chunks of the job to its result stream, after the `sent` already there;
        whether the last one was written (or the job ended without one: its client left while it
        waited in line, `left`)."""
        job_id = entry.job.id
        inbox = inbox_of(entry.job)
        seq = sent
        observer = current_job()
        if observer is not None:
            payload = observer.traced_payload(payload)
        chunks: AsyncGenerator[bytes, None] = lease.served.client.stream(payload)
        try:
            async for raw in chunks:
                if left is not None:
                    if await left:
                        note_outcome("skipped")
                        await acknowledge(self._redis, entry.stream, entry.entry_id, job_id)
                        return True
                    left = None
                chunk = chunk_decoder.decode(raw)
                if seq == 0 and waited_for_load(slot, entry.job.created):
                    chunk = msgspec.structs.replace(chunk, cold_start=True)
                    raw = encode(chunk)
                is_last = chunk.is_last
                if observer is not None:
                    observer.received(chunk)
                try:
                    gone = await self._writer.append(
                        job_id,
                        raw,
                        ack=entry.ack if is_last else None,
                        seq=seq,
                        first=seq == sent,
                        inbox=inbox,
                    )
                except Superseded:
                    await _abort(slot, job_id)
                    raise
                except Exception as exc:
                    # Redis refused the chunk even after retries: the engine must not run on to
                    # max_tokens for nobody.
                    await _abort(slot, job_id)
                    raise ChunkNotWritten(str(exc)) from exc
                seq += 1
                if observer is not None:
                    observer.written(is_last=is_last, gone=gone)
                if is_last:
                    return True
                if gone:
                    # Nobody reads on: stop the engine, and drop what it already made (a fast
                    # engine can be far ahead of the writes) instead of writing it for nobody.
                    await _abort(slot, job_id)
                    await self._writer.append(job_id, ABANDONED, ack=entry.ack, seq=seq, inbox=inbox)
                    return True
        finally:
            await chunks.aclose()
        return False

    async def fail(self, entry: Entry, error: JobError, *, create: bool) -> None:
        """Answer the job with `error`, which acknowledges it."""
        try:
            await self._writer.append(
                entry.job.id,
                encode(Chunk(error=error)),
                ack=entry.ack,
                create=create,
                inbox=inbox_of(entry.job),
            )
        except Exception:
            # Unacknowledged, the job stays pending in its stream rather than being lost.
            logger.exception(
                "could not record a failed job", extra={"job_id": entry.job.id, "code": error.code}
            )


def waited_for_load(slot: ModelSlot, created: float) -> bool:
    """Whether a job created at `created` waited for `slot`'s model to load (or wake): the slot
    became warm after the job was made, so the job's time to first token holds a cold start."""
    return slot.warm_since is not None and slot.warm_since > created


# A fresh job's plan: run it.
RUN = Plan(action="run")

# The closing chunk of a job whose client has gone: it acknowledges the job.
ABANDONED = encode(Chunk(finish_reason="abort", usage=Usage(prompt_tokens=0, completion_tokens=0)))


async def _abort(slot: ModelSlot, job_id: str, *, arriving: bool = False) -> None:
    try:
        await slot.abort(job_id, arriving=arriving)
    except Exception:
        logger.exception("could not abort a job in the engine", extra={"job_id": job_id})
