"""Take jobs from the model streams, run them through the local Triton models, append their chunks.

One XREADGROUP over the job streams of the models that are warm on this worker right now, asking
for no more jobs than there are free slots; the set is rebuilt on every pass, and with no model
warm the consumer waits for one. Jobs for a model nobody holds stay in its stream (the waiting
room) until some worker loads it. A job is acknowledged in the same round trip as its last chunk,
so a worker that dies mid-job leaves it pending for another worker to take over.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from switchboard import keys
from switchboard.redis_conn import stream_entries
from switchboard.tasks import cancel_and_wait
from switchboard.wire import Chunk, Job, JobError, chunk_decoder, encode, job_decoder
from workers.controller.residency import Lease, ModelSlot, SlotNotServing
from workers.result_writer import ResultWriter

logger = logging.getLogger(__name__)

# Short, so that a model that just became warm is read within a quarter second even while the
# consumer is blocked on the other models' streams.
BLOCK_MS = 250
RETRY_DELAY_S = 0.5
# Waiting jobs answered per round trip when a model cannot be loaded.
REFUSE_BATCH = 256


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
    ) -> None:
        self._redis = redis
        self._writer = writer
        self._worker_id = worker_id
        self._slots = {keys.job_stream(name): slot for name, slot in slots.items()}
        self._max_jobs = max_concurrent_jobs
        self._jobs: set[asyncio.Task[None]] = set()
        self._slot_freed = asyncio.Event()
        self._models_changed = asyncio.Event()
        self._read_done: asyncio.Event | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def running(self) -> int:
        """Jobs in progress."""
        return len(self._jobs)

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
        await self._ensure_groups(list(self._slots))
        self._reader = asyncio.create_task(self._read_loop(), name="job-consumer")

    async def stop(self, drain_timeout_s: float) -> None:
        """Take no new jobs; let running ones finish for `drain_timeout_s`, then cancel them.

        A cancelled job stays pending in its stream, unacknowledged, for another worker to take.
        """
        await cancel_and_wait(self._reader)
        self._reader = None
        if self._jobs:
            _, still_running = await asyncio.wait(self._jobs, timeout=drain_timeout_s)
            for task in still_running:
                task.cancel()
            await asyncio.gather(*still_running, return_exceptions=True)

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
                job = job_decoder.decode(fields[b"job"])
                await self._fail(job, (stream, entry_id), error)
                refused += 1

    async def _ensure_groups(self, streams: list[str]) -> None:
        for stream in streams:
            try:
                await self._redis.xgroup_create(stream, keys.JOB_GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def _read_loop(self) -> None:
        while True:
            free = self._max_jobs - len(self._jobs)
            if free <= 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            self._models_changed.clear()
            streams = [stream for stream, slot in self._slots.items() if slot.wants_jobs]
            if not streams:
                await self._models_changed.wait()
                continue
            self._read_done = asyncio.Event()
            try:
                await self._read_once(streams, free)
            finally:
                self._read_done.set()
                self._read_done = None

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
                self._spawn(stream.decode(), entry_id, fields[b"job"])

    def _spawn(self, stream: str, entry_id: bytes, payload: bytes) -> None:
        try:
            lease = self._slots[stream].lease()
        except SlotNotServing:
            # Cannot happen after the read barrier; if it ever does, the job goes back in line.
            task = asyncio.create_task(self._requeue(stream, entry_id, payload))
        else:
            task = asyncio.create_task(self._run_job(stream, entry_id, payload, lease))
        self._jobs.add(task)
        task.add_done_callback(self._job_done)

    def _job_done(self, task: asyncio.Task[None]) -> None:
        self._jobs.discard(task)
        self._slot_freed.set()

    async def _requeue(self, stream: str, entry_id: bytes, payload: bytes) -> None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.xadd(stream, {"job": payload})
        pipe.xack(stream, keys.JOB_GROUP, entry_id)
        pipe.xdel(stream, entry_id)
        await pipe.execute()

    async def _run_job(self, stream: str, entry_id: bytes, payload: bytes, lease: Lease) -> None:
        try:
            await self._run_leased_job(stream, entry_id, payload, lease)
        finally:
            lease.release()

    async def _run_leased_job(self, stream: str, entry_id: bytes, payload: bytes, lease: Lease) -> None:
        job = job_decoder.decode(payload)
        ack = (stream, entry_id)
        if time.time() > job.deadline:
            # Its client has had its answer (a timeout) already: the job must never run late.
            await self._fail(
                job, ack, JobError(code="timeout", message="the job expired before a worker took it")
            )
            return
        slot = self._slots[stream]
        try:
            finished = await self._stream_job(job, payload, slot, lease, ack)
        except Exception:
            logger.exception("job failed", extra={"job_id": job.id, "model": job.model})
            message = f"The worker failed while running job {job.id}; its log has the reason."
            await self._fail(job, ack, JobError(code="engine_error", message=message))
            return
        if not finished:
            await self._fail(
                job, ack, JobError(code="engine_error", message="the engine ended without a result")
            )

    async def _stream_job(
        self, job: Job, payload: bytes, slot: ModelSlot, lease: Lease, ack: tuple[str, bytes]
    ) -> bool:
        aborted = False
        async for raw in lease.served.client.stream(payload):
            is_last = chunk_decoder.decode(raw).is_last
            cancelled = await self._writer.append(job.id, raw, ack=ack if is_last else None)
            if is_last:
                return True
            if cancelled and not aborted:
                aborted = True
                await slot.abort(job.id)
        return False

    async def _fail(self, job: Job, ack: tuple[str, bytes], error: JobError) -> None:
        try:
            await self._writer.append(job.id, encode(Chunk(error=error)), ack=ack)
        except Exception:
            # Unacknowledged, the job stays pending in its stream rather than being lost.
            logger.exception("could not record a failed job", extra={"job_id": job.id, "code": error.code})
