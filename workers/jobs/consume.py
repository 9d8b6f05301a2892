"""Take jobs from the model streams, run them through the local Triton models, append their chunks.

One XREADGROUP over the job streams of the models that are warm on this worker right now, asking
for no more jobs than there are free slots; the set is rebuilt on every pass, and with no model
warm the consumer waits for one. Jobs for a model nobody holds stay in its stream (the waiting
room) until some worker loads it. A job is acknowledged in the same round trip as its last chunk,
so a worker that dies mid-job leaves it pending, and another worker's sweep puts it back in line
(`workers.jobs.takeover`); the worker that takes it then goes on where the client's stream stopped
(`workers.jobs.continuation`). An entry that cannot be decoded goes to the dead-letter stream, and nothing
that goes wrong in one pass stops the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Mapping
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from switchboard import keys
from switchboard.redis_conn import stream_entries
from switchboard.tasks import cancel_and_wait
from switchboard.wire import Chunk, JobError, Usage, chunk_decoder, encode
from workers.jobs.continuation import Plan, client_left, plan
from workers.jobs.observer import JobObserver, current_job, note_outcome
from workers.jobs.orphans import ORPHAN_GRACE_S, OrphanWatch
from workers.jobs.takeover import Entry, Takeover, acknowledge, dead_letter, decode_entry
from workers.jobs.writer import ResultWriter, Superseded
from workers.models.slot import Lease, ModelSlot, SlotNotServing
from workers.triton.model import EngineJob

logger = logging.getLogger(__name__)

# Short, so that a model that just became warm is read within a quarter second even while the
# consumer is blocked on the other models' streams.
BLOCK_MS = 250
RETRY_DELAY_S = 0.5
# Waiting jobs answered per round trip when a model cannot be loaded.
REFUSE_BATCH = 256


class ChunkNotWritten(RuntimeError):
    """Redis refused a chunk of the job even after retries; the job is left for a takeover."""


class JobConsumer:
    """Runs jobs for the warm models of one worker, at most `max_concurrent_jobs` at once."""

    def __init__(
        self,
        redis: aioredis.Redis,
        writer: ResultWriter,
        *,
        worker_id: str,
        slots: Mapping[str, ModelSlot],
        max_concurrent_jobs: int,
        max_deliveries: int = 3,
        takeover_check_s: float = 2.0,
        orphan_grace_s: float = ORPHAN_GRACE_S,
        on_failure: Callable[[], None] = lambda: None,
    ) -> None:
        """`on_failure` is called if the loop that takes jobs ends while the consumer is not stopping."""
        self._redis = redis
        self._writer = writer
        self._worker_id = worker_id
        self._slots = {keys.job_stream(name): slot for name, slot in slots.items()}
        self._max_jobs = max_concurrent_jobs
        self._takeover = Takeover(redis, writer, worker_id=worker_id, max_deliveries=max_deliveries)
        self._takeover_check_s = takeover_check_s
        self._on_failure = on_failure
        self._jobs: set[asyncio.Task[None]] = set()
        # The entries of the running jobs, to put back in line if they outlast a drain.
        self._entries: dict[asyncio.Task[None], Entry] = {}
        self._slot_freed = asyncio.Event()
        self._models_changed = asyncio.Event()
        self._read_done: asyncio.Event | None = None
        self._reader: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._orphans = OrphanWatch(redis, grace_s=orphan_grace_s)
        self._orphan_watch: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def running(self) -> int:
        """Jobs in progress."""
        return len(self._jobs)

    @property
    def reading(self) -> bool:
        """Whether the loop that takes jobs is running (the heartbeat beats only while it is)."""
        return self._reader is not None and not self._reader.done()

    def models_changed(self) -> None:
        """A model became warm or stopped being warm: rebuild the read."""
        self._models_changed.set()

    async def read_barrier(self) -> None:
        """Return once the read in progress (if any) is over and its jobs hold their leases."""
        if self._read_done is not None:
            await self._read_done.wait()

    async def start(self) -> None:
        """Join the consumer group of every model stream and start taking jobs.

        Groups are created at id 0 for every model this worker may hold, so jobs enqueued before
        any worker joined are not lost.
        """
        self._stopping = False
        await self._ensure_groups(list(self._slots))
        self._reader = asyncio.create_task(self._read_loop(), name="job-consumer")
        self._reader.add_done_callback(self._reader_ended)
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="job-takeover")
        self._orphan_watch = asyncio.create_task(self._orphans.run(), name="orphan-watch")

    async def stop_taking(self) -> None:
        """Take no new jobs (the first step of a stop: jobs still waiting go to other workers)."""
        self._stopping = True
        await cancel_and_wait(self._reader)
        await cancel_and_wait(self._sweeper)
        self._reader = self._sweeper = None

    async def stop(self, drain_timeout_s: float) -> None:
        """Take no new jobs; let running ones finish for `drain_timeout_s`, then hand them back.

        A job still running then is cancelled and put back in line for another worker, which
        continues it where its client's stream stopped.
        """
        await self.stop_taking()
        try:
            await self._drain(drain_timeout_s)
        finally:
            # Watched to the end: a draining job whose front door dies is not generated for nobody.
            await cancel_and_wait(self._orphan_watch)
            self._orphan_watch = None

    async def _drain(self, timeout_s: float) -> None:
        if not self._jobs:
            return
        _, still_running = await asyncio.wait(self._jobs, timeout=timeout_s)
        unfinished = [self._entries[task] for task in still_running if task in self._entries]
        for task in still_running:
            task.cancel()
        await asyncio.gather(*still_running, return_exceptions=True)
        for entry in unfinished:
            await self._hand_back(entry)

    async def refuse_waiting(self, model: str, error: JobError) -> int:
        """Answer every job waiting for `model` with `error` (its load failed); returns how many."""
        stream = keys.job_stream(model)
        refused = 0
        while True:
            response = await self._redis.xreadgroup(
                keys.JOB_GROUP, self._worker_id, {stream: ">"}, count=REFUSE_BATCH
            )
            entries = [entry for _, stream_entries_ in stream_entries(response) for entry in stream_entries_]
            if not entries:
                return refused
            for entry_id, fields in entries:
                entry = await self._decoded(stream, entry_id, fields)
                if entry is not None:
                    await self._fail(entry, error, create=True)
                    refused += 1

    async def _ensure_groups(self, streams: list[str]) -> None:
        for stream in streams:
            try:
                await self._redis.xgroup_create(stream, keys.JOB_GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    # --- the loops ------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        while True:
            try:
                await self._read_pass()
            except Exception:
                # One bad pass must not end the loop: the worker would hold its models and serve nothing.
                logger.exception("taking jobs failed; going on", extra={"worker_id": self._worker_id})
                await asyncio.sleep(RETRY_DELAY_S)

    async def _read_pass(self) -> None:
        free = self._max_jobs - len(self._jobs)
        if free <= 0:
            self._slot_freed.clear()
            await self._slot_freed.wait()
            return
        self._models_changed.clear()
        streams = [stream for stream, slot in self._slots.items() if slot.wants_jobs]
        if not streams:
            await self._models_changed.wait()
            return
        self._read_done = asyncio.Event()
        try:
            await self._read_once(streams, free)
        finally:
            self._read_done.set()
            self._read_done = None

    def _reader_ended(self, task: asyncio.Task[None]) -> None:
        if self._stopping:
            return
        error = None if task.cancelled() else task.exception()
        logger.critical(
            "the loop that takes jobs has ended; this worker stops advertising itself and stops",
            exc_info=error,
            extra={"worker_id": self._worker_id},
        )
        self._on_failure()

    async def _sweep_loop(self) -> None:
        """Every `takeover_check_s`, put the jobs of dead workers back in line."""
        while True:
            await asyncio.sleep(self._takeover_check_s)
            try:
                running = {entry.entry_id for entry in self._entries.values()}
                await self._takeover.sweep(list(self._slots), running)
            except Exception:
                logger.exception("looking for jobs of dead workers failed; going on")

    async def _read_once(self, streams: list[str], free: int) -> None:
        try:
            response = await self._redis.xreadgroup(
                keys.JOB_GROUP,
                self._worker_id,
                {stream: ">" for stream in streams},  # type: ignore[misc]
                count=free,
                block=BLOCK_MS,
            )
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await self._ensure_groups(streams)  # the stream expired or Redis restarted empty
            return
        except (ConnectionError, OSError, aioredis.RedisError):
            logger.exception("reading jobs failed; retrying")
            await asyncio.sleep(RETRY_DELAY_S)
            return
        for stream, entries in stream_entries(response):
            for entry_id, fields in entries:
                self._take(stream.decode(), entry_id, fields)

    # --- one job --------------------------------------------------------------------------------

    def _take(self, stream: str, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        """Start a task for one entry read; its lease is taken here, before the task starts."""
        try:
            entry = decode_entry(stream, entry_id, fields)
        except (KeyError, msgspec.DecodeError) as exc:
            reason = f"the entry cannot be decoded as a job: {exc!r}"
            self._start(self._bury(stream, entry_id, fields, reason))
            return
        try:
            lease = self._slots[stream].lease()
        except SlotNotServing:
            # Cannot happen after the read barrier; if it ever does, the job goes back in line.
            self._start(self._hand_back(entry))
        else:
            self._start(self._run_job(entry, lease), entry)

    def _start(self, work: Coroutine[Any, Any, None], entry: Entry | None = None) -> None:
        task = asyncio.create_task(work)
        self._jobs.add(task)
        if entry is not None:
            self._entries[task] = entry
        task.add_done_callback(self._job_done)

    def _job_done(self, task: asyncio.Task[None]) -> None:
        self._jobs.discard(task)
        self._entries.pop(task, None)
        self._slot_freed.set()

    async def _decoded(self, stream: str, entry_id: bytes, fields: dict[bytes, bytes]) -> Entry | None:
        try:
            return decode_entry(stream, entry_id, fields)
        except (KeyError, msgspec.DecodeError) as exc:
            await self._bury(stream, entry_id, fields, f"the entry cannot be decoded as a job: {exc!r}")
            return None

    async def _bury(self, stream: str, entry_id: bytes, fields: dict[bytes, bytes], reason: str) -> None:
        try:
            await dead_letter(self._redis, stream, entry_id, fields, reason=reason, worker_id=self._worker_id)
        except Exception:
            logger.exception("could not move an entry to the dead-letter stream", extra={"stream": stream})

    async def _hand_back(self, entry: Entry) -> None:
        """Put a job this worker could not run or finish back in line; it does not count as a failure."""
        try:
            if await self._takeover.requeue(entry.stream, entry.entry_id, entry.payload, entry.taken_before):
                logger.warning("job handed back", extra={"job_id": entry.job.id})
        except Exception:
            # Left pending, it is taken over once this worker's record has expired.
            logger.exception("could not hand a job back", extra={"job_id": entry.job.id})

    async def _run_job(self, entry: Entry, lease: Lease) -> None:
        observer = JobObserver.taken(entry, self._worker_id, self._slots[entry.stream])
        try:
            await self._run_leased_job(entry, lease)
        except Exception:
            # Left pending and no longer running here, the job is put back in line by a sweep.
            logger.exception("a job could not be run", extra={"job_id": entry.job.id})
        finally:
            lease.release()
            observer.ended()

    async def _run_leased_job(self, entry: Entry, lease: Lease) -> None:
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
            await self._fail(
                entry,
                JobError(code="timeout", message="the job expired before a worker took it"),
                create=fresh,
            )
            return
        if where.error is not None:
            await self._fail(entry, where.error, create=False)
            return
        payload = entry.payload
        if where.action == "continue_":
            payload = encode(EngineJob(**msgspec.structs.asdict(job), continuation=where.continuation))
            logger.info("continuing a job taken over", extra={"job_id": job.id, "taken": entry.taken_before})
        slot = self._slots[entry.stream]
        self._orphans.track(job, abort=lambda: _abort(slot, job.id))
        left = None if entry.requeued else asyncio.ensure_future(self._left_while_queued(job.id, slot))
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
            await self._fail(entry, JobError(code="engine_error", message=message), create=False)
            return
        finally:
            self._orphans.untrack(job.id)
            if left is not None:
                await cancel_and_wait(left)
        if not finished:
            await self._fail(
                entry,
                JobError(code="engine_error", message="the engine ended without a result"),
                create=False,
            )

    async def _left_while_queued(self, job_id: str, slot: ModelSlot) -> bool:
        """Whether the client of a job just sent to the engine left while the job waited in line;
        if so, the job is aborted, there or on its way."""
        try:
            left = await client_left(self._redis, job_id)
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
                is_last = chunk.is_last
                if observer is not None:
                    observer.received(chunk)
                try:
                    gone = await self._writer.append(
                        job_id, raw, ack=entry.ack if is_last else None, seq=seq, first=seq == sent
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
                    await self._writer.append(job_id, ABANDONED, ack=entry.ack, seq=seq)
                    return True
        finally:
            await chunks.aclose()
        return False

    async def _fail(self, entry: Entry, error: JobError, *, create: bool) -> None:
        try:
            await self._writer.append(entry.job.id, encode(Chunk(error=error)), ack=entry.ack, create=create)
        except Exception:
            # Unacknowledged, the job stays pending in its stream rather than being lost.
            logger.exception(
                "could not record a failed job", extra={"job_id": entry.job.id, "code": error.code}
            )


# A fresh job's plan: run it.
RUN = Plan(action="run")

# The closing chunk of a job whose client has gone: it acknowledges the job.
ABANDONED = encode(Chunk(finish_reason="abort", usage=Usage(prompt_tokens=0, completion_tokens=0)))


async def _abort(slot: ModelSlot, job_id: str, *, arriving: bool = False) -> None:
    try:
        await slot.abort(job_id, arriving=arriving)
    except Exception:
        logger.exception("could not abort a job in the engine", extra={"job_id": job_id})
