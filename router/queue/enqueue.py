"""Put a job on its model's stream in one round trip."""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard import keys
from switchboard.cancel_marks import CancelMarks
from switchboard.wire import Chunk, Job, LoadFailure, chunk_decoder, encode, load_failure_decoder

logger = logging.getLogger(__name__)

# One round trip for everything an enqueue does. A model whose last load failed takes no job: the
# failure's payload comes back instead, and the request is answered at once. Otherwise the job goes
# on its stream with its record (`keys.job_record`) and the model controllers are poked; the front
# door's own reader is poked only when asked (when it is blocked and must pick up the new result
# stream). A job whose record exists is queued already: redis-py retries a command whose reply a
# broken connection lost, and the retry must not queue the job twice.
# KEYS: failure mark, job stream, demand stream, job record[, wake stream]
# ARGV: job, job stream ttl, model, demand maxlen, demand ttl, wake ttl, tenant, record ttl
_ENQUEUE_LUA = """
local failure = redis.call('GET', KEYS[1])
if failure then
    return failure
end
if redis.call('EXISTS', KEYS[4]) == 1 then
    return false
end
redis.call('HSET', KEYS[4], 'tenant', ARGV[7], 'readers', 1)
redis.call('EXPIRE', KEYS[4], ARGV[8])
redis.call('XADD', KEYS[2], '*', 'job', ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'm', ARGV[3])
redis.call('EXPIRE', KEYS[3], ARGV[5])
if KEYS[5] then
    redis.call('XADD', KEYS[5], 'MAXLEN', '1', '*', 'w', '')
    redis.call('EXPIRE', KEYS[5], ARGV[6])
end
return false
"""

# Reads a job's record for a client resuming its stream, and counts the client in as a reader.
# KEYS: job record, result stream. ARGV: record ttl, the last entry the client had.
# Returns nil when the job's results are gone, else the tenant that sent the job and the chunks
# up to that entry (the relay reads them again to pick up where the client's stream stopped).
_RESUME_LUA = """
if redis.call('EXISTS', KEYS[2]) == 0 or redis.call('EXISTS', KEYS[1]) == 0 then
    return false
end
redis.call('HINCRBY', KEYS[1], 'readers', 1)
redis.call('HINCRBY', KEYS[1], 'resumes', 1)
if redis.call('TTL', KEYS[1]) < tonumber(ARGV[1]) then
    redis.call('EXPIRE', KEYS[1], ARGV[1])
end
return {redis.call('HGET', KEYS[1], 'tenant'), redis.call('XRANGE', KEYS[2], '-', ARGV[2])}
"""


class Resumption(msgspec.Struct, frozen=True, kw_only=True):
    """A job's stream as a client resuming it finds it."""

    tenant: str  # the API key that sent the job ("" without keys)
    earlier: list[Chunk]  # the chunks the client had already


def _field(fields: list[bytes], name: bytes) -> bytes:
    """A field of a stream entry as a script returns it (a flat list of names and values)."""
    return fields[fields.index(name) + 1]


class JobQueue:
    """The front door's side of the job streams."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        # Registered once: later calls send only the script's hash (EVALSHA), loading it on a miss.
        self._enqueue = redis.register_script(_ENQUEUE_LUA)
        self._resume = redis.register_script(_RESUME_LUA)
        self._cancel_marks = CancelMarks(redis)
        # Cancel marks waiting for a client that may resume its stream, by job id.
        self._pending_cancels: dict[str, asyncio.Task[None]] = {}

    async def submit(self, job: Job, *, wake_stream: str | None = None) -> LoadFailure | None:
        """Append the job to its model's stream, unless the model's last load failed: then its failure.

        Its record (`keys.job_record`) is written, and the demand stream (and `wake_stream`, if
        given) poked, in the same round trip. Submitting a job again queues nothing.
        """
        script_keys = [
            keys.load_failure(job.model),
            keys.job_stream(job.model),
            keys.demand_stream(),
            keys.job_record(job.id),
        ]
        if wake_stream is not None:
            script_keys.append(wake_stream)
        args: list[bytes | str | int] = [
            encode(job),
            keys.JOB_STREAM_TTL_S,
            job.model,
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
        chunks = [chunk_decoder.decode(_field(fields, b"c")) for _, fields in entries]
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
            pipe.hincrby(keys.job_record(job_id), "readers", -1)
            pipe.expire(keys.result_stream(job_id), keys.RESULT_TTL_S)
            pipe.expire(keys.job_record(job_id), keys.RESULT_TTL_S)
        else:
            pipe.unlink(keys.result_stream(job_id), keys.job_record(job_id))
        await pipe.execute()

    def cancel_later(self, job_id: str, *, after_s: float) -> None:
        """Leave the cancel mark after `after_s`, unless a client is reading the job's results by then
        (it resumed the stream, through this front door or another)."""
        task = asyncio.get_running_loop().create_task(self._cancel_later(job_id, after_s))
        self._pending_cancels[job_id] = task
        task.add_done_callback(lambda _: self._pending_cancels.pop(job_id, None))

    async def _cancel_later(self, job_id: str, after_s: float) -> None:
        await asyncio.sleep(after_s)
        try:
            readers = int(await self._redis.hget(keys.job_record(job_id), "readers") or 0)  # type: ignore[misc]
            if readers <= 0:
                await self.cancel(job_id)
        except RedisError:
            logger.warning("could not leave a cancel mark", extra={"job_id": job_id})

    async def stop(self) -> None:
        """Drop the cancel marks still waiting for a resumption. Their jobs run on to their end: a
        front door stops mostly to be replaced, and its clients then resume through another one."""
        pending, self._pending_cancels = self._pending_cancels, {}
        for task in pending.values():
            task.cancel()
        await asyncio.gather(*pending.values(), return_exceptions=True)


def record_ttl_s(job: Job) -> int:
    """How long a job's record lives: until its results expire after its deadline."""
    return max(1, int(job.deadline - time.time()) + keys.RESULT_TTL_S)
