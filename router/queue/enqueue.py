"""Put a job on its model's stream in one round trip (`switchboard/lua/enqueue.lua`, which also notes
the model in the demand index), and count the readers of its results (`resume.lua`, and a reader
that leaves)."""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard import keys, lua
from switchboard.cancel_marks import CancelMarks
from switchboard.tasks import TaskSet
from switchboard.wire import Chunk, Job, LoadFailure, chunk_decoder, encode, load_failure_decoder

logger = logging.getLogger(__name__)


class Resumption(msgspec.Struct, frozen=True, kw_only=True):
    """A job's stream as a client resuming it finds it."""

    tenant: str  # the API key that sent the job ("" without keys)
    earlier: list[Chunk]  # the chunks the client had already


def _field(fields: list[bytes], name: bytes) -> bytes:
    """A field of a stream entry as a script returns it (a flat list of names and values)."""
    return fields[fields.index(name) + 1]


class JobQueue:
    """The front door's side of the job streams."""

    def __init__(self, redis: aioredis.Redis, tasks: TaskSet) -> None:
        self._redis = redis
        self._tasks = tasks
        # Registered once: later calls send only the script's hash (EVALSHA), loading it on a miss.
        self._enqueue = lua.register(redis, "enqueue")
        self._resume = lua.register(redis, "resume")
        self._cancel_marks = CancelMarks(redis)

    async def submit(self, job: Job, *, wake_stream: str | None = None) -> LoadFailure | None:
        """Append the job to its model's stream, unless the model's last load failed: then its failure.

        Its record (`keys.job_record`) is written, its model noted in the demand index, and the
        demand stream (and `wake_stream`, if given) poked, in the same round trip. Submitting a job
        again queues nothing.
        """
        script_keys = [
            keys.load_failure(job.model),
            keys.job_stream(job.model),
            keys.job_record(job.id),
            keys.demand_index(),
            keys.demand_stream(),
        ]
        if wake_stream is not None:
            script_keys.append(wake_stream)
        args: list[bytes | str | int] = [
            encode(job),
            keys.JOB_STREAM_TTL_S,
            job.model,
            job.id,
            keys.DEMAND_INDEX_TTL_S,
            keys.DEMAND_MAXLEN,
            keys.DEMAND_TTL_S,
            keys.WAKE_TTL_S,
            job.tenant or "",
            record_ttl_s(job),
        ]
        failure = await self._enqueue(keys=script_keys, args=args)
        return None if failure is None else load_failure_decoder.decode(failure)

    async def resume(self, job_id: str, after: str) -> Resumption | None:
        """Count one more reader of `job_id`'s results; who sent the job and the chunks up to entry
        `after`, or None when its results are not kept (an unknown job, or one whose results were
        deleted or expired)."""
        found = await self._resume(
            keys=[keys.job_record(job_id), keys.result_stream(job_id)], args=[keys.RESULT_TTL_S, after]
        )
        if found is None:
            return None
        tenant, entries = found
        chunks = [chunk_decoder.decode(_field(fields, keys.CHUNK_FIELD.encode())) for _, fields in entries]
        return Resumption(tenant=tenant.decode(), earlier=chunks)

    async def cancel(self, job_id: str) -> None:
        """Leave a cancel mark (unless the job ended): the worker running it stops generating for it."""
        await self._cancel_marks.leave(job_id)

    async def leave(self, job_id: str, *, cancel: bool, keep_results: bool) -> None:
        """A job whose reader left before its end: its cancel mark (if `cancel`), and its result
        stream and record deleted, or kept until they expire for a client that resumes the stream
        (`keep_results`: the reader is counted out of the job's readers)."""
        pipe = self._redis.pipeline(transaction=False)
        if cancel:
            await self._cancel_marks.leave(job_id, client=pipe)
        if keep_results:
            pipe.hincrby(keys.job_record(job_id), keys.READERS_FIELD, -1)
            pipe.expire(keys.result_stream(job_id), keys.RESULT_TTL_S)
            pipe.expire(keys.job_record(job_id), keys.RESULT_TTL_S)
        else:
            pipe.unlink(keys.result_stream(job_id), keys.job_record(job_id))
        await pipe.execute()

    def cancel_later(self, job_id: str, *, after_s: float) -> None:
        """Leave the cancel mark after `after_s`, unless a client is reading the job's results by then
        (it resumed the stream, through this front door or another). A mark still waiting when the
        front door stops is dropped with its task set: its job runs on to its end, since a front door
        stops mostly to be replaced, and its clients then resume through another one."""
        self._tasks.start(self._cancel_later(job_id, after_s), "cancel mark after the resume grace")

    async def _cancel_later(self, job_id: str, after_s: float) -> None:
        await asyncio.sleep(after_s)
        try:
            readers = int(await self._redis.hget(keys.job_record(job_id), keys.READERS_FIELD) or 0)  # type: ignore[misc]
            if readers <= 0:
                await self.cancel(job_id)
        except RedisError:
            logger.warning("could not leave a cancel mark", extra={"job_id": job_id})


def record_ttl_s(job: Job) -> int:
    """How long a job's record lives: until its results expire after its deadline."""
    return max(1, int(job.deadline - time.time()) + keys.RESULT_TTL_S)
