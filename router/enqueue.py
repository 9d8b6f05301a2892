"""Put a job on its model's stream in one round trip."""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard import keys
from switchboard.wire import Job, LoadFailure, encode, load_failure_decoder

logger = logging.getLogger(__name__)

# One round trip for everything an enqueue does. A model whose last load failed takes no job: the
# failure's payload comes back instead, and the request is answered at once. Otherwise the job goes
# on its stream and the model controllers are poked; the front door's own reader is poked only when
# asked (when it is blocked and must pick up the new result stream).
# KEYS: failure mark, job stream, demand stream[, wake stream]
# ARGV: job, job stream ttl, model, demand maxlen, demand ttl, wake ttl
_ENQUEUE_LUA = """
local failure = redis.call('GET', KEYS[1])
if failure then
    return failure
end
redis.call('XADD', KEYS[2], '*', 'job', ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'm', ARGV[3])
redis.call('EXPIRE', KEYS[3], ARGV[5])
if KEYS[4] then
    redis.call('XADD', KEYS[4], 'MAXLEN', '1', '*', 'w', '')
    redis.call('EXPIRE', KEYS[4], ARGV[6])
end
return false
"""


class JobQueue:
    """The front door's side of the job streams."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        # Registered once: later calls send only the script's hash (EVALSHA), loading it on a miss.
        self._enqueue = redis.register_script(_ENQUEUE_LUA)
        # Cancel marks waiting for a client that may resume its stream, by job id.
        self._pending_cancels: dict[str, asyncio.Task[None]] = {}

    async def submit(self, job: Job, *, wake_stream: str | None = None) -> LoadFailure | None:
        """Append the job to its model's stream, unless the model's last load failed: then its failure.

        Poking the demand stream (and `wake_stream`, if given) happens in the same round trip.
        """
        script_keys = [keys.load_failure(job.model), keys.job_stream(job.model), keys.demand_stream()]
        if wake_stream is not None:
            script_keys.append(wake_stream)
        args: list[bytes | str | int] = [
            encode(job),
            keys.JOB_STREAM_TTL_S,
            job.model,
            keys.DEMAND_MAXLEN,
            keys.DEMAND_TTL_S,
            keys.WAKE_TTL_S,
        ]
        failure = await self._enqueue(keys=script_keys, args=args)
        return None if failure is None else load_failure_decoder.decode(failure)

    async def cancel(self, job_id: str) -> None:
        """Leave a cancel mark: the worker running the job stops generating for it."""
        await self._redis.set(keys.cancel_mark(job_id), b"1", ex=keys.CANCEL_TTL_S)

    async def leave(self, job_id: str, *, cancel: bool, keep_results: bool) -> None:
        """A job whose reader left before its end: its cancel mark (if `cancel`), and its result
        stream deleted, or kept until it expires for a client that resumes it (`keep_results`)."""
        pipe = self._redis.pipeline(transaction=False)
        if cancel:
            pipe.set(keys.cancel_mark(job_id), b"1", ex=keys.CANCEL_TTL_S)
        if keep_results:
            pipe.expire(keys.result_stream(job_id), keys.RESULT_TTL_S)
        else:
            pipe.unlink(keys.result_stream(job_id))
        await pipe.execute()

    def cancel_later(self, job_id: str, *, resumes_seen: int, after_s: float) -> None:
        """Leave the cancel mark after `after_s`, unless a client resumed the job's stream meanwhile
        (the job's resume count is no longer `resumes_seen`)."""
        task = asyncio.get_running_loop().create_task(self._cancel_later(job_id, resumes_seen, after_s))
        self._pending_cancels[job_id] = task
        task.add_done_callback(lambda _: self._pending_cancels.pop(job_id, None))

    async def _cancel_later(self, job_id: str, resumes_seen: int, after_s: float) -> None:
        await asyncio.sleep(after_s)
        try:
            resumed = int(await self._redis.get(keys.resumes(job_id)) or 0)
            if resumed == resumes_seen:
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
