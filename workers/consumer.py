"""Take jobs from the model streams, run them through the local Triton models, append their chunks.

One XREADGROUP over the job streams of every model this worker holds, asking for no more jobs
than there are free slots. A job is acknowledged in the same round trip as its last chunk, so a
worker that dies mid-job leaves it pending for another worker to take over.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from switchboard import keys
from switchboard.redis_conn import stream_entries
from switchboard.tasks import cancel_and_wait
from switchboard.wire import Chunk, Job, JobError, chunk_decoder, encode, job_decoder
from workers.result_writer import ResultWriter
from workers.triton_client import TritonJobClient
from workers.triton_model import EngineCallable

logger = logging.getLogger(__name__)

BLOCK_MS = 1_000
RETRY_DELAY_S = 0.5


@dataclass
class ServedModel:
    """A model this worker holds: the client of its Triton model, and that model's callable (for aborts)."""

    name: str
    client: TritonJobClient
    triton_model: EngineCallable


class JobConsumer:
    """Runs jobs for the models of one worker, at most `max_concurrent_jobs` at once."""

    def __init__(
        self,
        redis: aioredis.Redis,
        writer: ResultWriter,
        *,
        worker_id: str,
        models: list[ServedModel],
        max_concurrent_jobs: int,
    ) -> None:
        self._redis = redis
        self._writer = writer
        self._worker_id = worker_id
        self._models = {keys.job_stream(m.name): m for m in models}
        self._max_jobs = max_concurrent_jobs
        self._jobs: set[asyncio.Task[None]] = set()
        self._slot_freed = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    @property
    def running(self) -> int:
        """Jobs in progress."""
        return len(self._jobs)

    async def start(self) -> None:
        """Join the consumer group of every model stream and start taking jobs."""
        await self._ensure_groups()
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

    async def _ensure_groups(self) -> None:
        for stream in self._models:
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
            try:
                response = await self._redis.xreadgroup(
                    keys.JOB_GROUP,
                    self._worker_id,
                    {stream: ">" for stream in self._models},  # type: ignore[misc]
                    count=free,
                    block=BLOCK_MS,
                )
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                await self._ensure_groups()  # the stream expired or Redis restarted empty
                continue
            except (ConnectionError, OSError, aioredis.RedisError):
                logger.exception("reading jobs failed; retrying")
                await asyncio.sleep(RETRY_DELAY_S)
                continue
            for stream, entries in stream_entries(response):
                for entry_id, fields in entries:
                    self._spawn(stream.decode(), entry_id, fields[b"job"])

    def _spawn(self, stream: str, entry_id: bytes, payload: bytes) -> None:
        task = asyncio.create_task(self._run_job(stream, entry_id, payload))
        self._jobs.add(task)
        task.add_done_callback(self._job_done)

    def _job_done(self, task: asyncio.Task[None]) -> None:
        self._jobs.discard(task)
        self._slot_freed.set()

    async def _run_job(self, stream: str, entry_id: bytes, payload: bytes) -> None:
        job = job_decoder.decode(payload)
        ack = (stream, entry_id)
        if time.time() > job.deadline:
            await self._fail(
                job, ack, JobError(code="timeout", message="the job expired before a worker took it")
            )
            return
        model = self._models[stream]
        try:
            finished = await self._stream_job(job, payload, model, ack)
        except Exception as exc:
            logger.exception("job failed", extra={"job_id": job.id, "model": job.model})
            await self._fail(job, ack, JobError(code="engine_error", message=f"the worker failed: {exc}"))
            return
        if not finished:
            await self._fail(
                job, ack, JobError(code="engine_error", message="the engine ended without a result")
            )

    async def _stream_job(self, job: Job, payload: bytes, model: ServedModel, ack: tuple[str, bytes]) -> bool:
        aborted = False
        async for raw in model.client.stream(payload):
            is_last = chunk_decoder.decode(raw).is_last
            cancelled = await self._writer.append(job.id, raw, ack=ack if is_last else None)
            if is_last:
                return True
            if cancelled and not aborted:
                aborted = True
                await asyncio.wrap_future(model.triton_model.abort(job.id))
        return False

    async def _fail(self, job: Job, ack: tuple[str, bytes], error: JobError) -> None:
        try:
            await self._writer.append(job.id, encode(Chunk(error=error)), ack=ack)
        except Exception:
            # Unacknowledged, the job stays pending in its stream rather than being lost.
            logger.exception("could not record a failed job", extra={"job_id": job.id, "code": error.code})
