"""Append result chunks of every running job to Redis, many jobs per round trip.

Each running job hands its chunk to the writer and awaits the flush. The writer sends whatever is
waiting as one pipeline the moment it is free, so a lone chunk leaves at once and chunks that pile
up while a flush is in flight share the next one. Each chunk is appended by a small script that
also tells whether the job's client has gone away (its cancel mark, or its result stream deleted)
and, with the job's last chunk, acknowledges the job and deletes its cancel mark.
"""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis

from switchboard import keys

logger = logging.getLogger(__name__)

# A flush that fails is tried again after these pauses before its writers are told it failed.
RETRY_DELAYS_S = (0.05, 0.25)

# KEYS: result stream, cancel mark, job stream (the result stream again when nothing is acked).
# ARGV: chunk, result TTL, "1" if the chunk may create the result stream, entry id to acknowledge
# ("" for none), consumer group.
# Only a job's first chunk may create its result stream: a stream the front door deleted (its
# client left, or it read the last chunk) is never brought back by a late chunk. Returns 1 when
# nobody reads the stream any more (a cancel mark, or the stream gone), else 0.
APPEND_SCRIPT = """
local written = 0
if ARGV[3] == '1' or redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('XADD', KEYS[1], '*', 'c', ARGV[1])
  redis.call('EXPIRE', KEYS[1], ARGV[2])
  written = 1
end
if ARGV[4] ~= '' then
  redis.call('XACK', KEYS[3], ARGV[5], ARGV[4])
  redis.call('XDEL', KEYS[3], ARGV[4])
  redis.call('DEL', KEYS[2])
  return 1 - written
end
if written == 0 then
  return 1
end
return redis.call('EXISTS', KEYS[2])
"""


class _Write:
    __slots__ = ("ack", "create", "done", "job_id", "payload")

    def __init__(self, job_id: str, payload: bytes, ack: tuple[str, bytes] | None, create: bool) -> None:
        self.job_id = job_id
        self.payload = payload
        self.ack = ack
        self.create = create
        self.done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()


class ResultWriter:
    """Batches chunk appends of all jobs of one worker into pipelines."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._pending: list[_Write] = []
        self._has_pending = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._script_sha: str | None = None

    def start(self) -> None:
        """Start the flush loop."""
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="result-writer")

    async def stop(self) -> None:
        """Flush what is pending or in flight, then end the loop; idempotent."""
        if self._task is None:
            return
        self._stopping = True
        self._has_pending.set()
        await self._task
        self._task = None

    async def append(
        self, job_id: str, payload: bytes, *, ack: tuple[str, bytes] | None = None, create: bool = True
    ) -> bool:
        """Append one encoded chunk; `ack` = (job stream, entry id) for the job's last chunk.

        `create`: the job's result stream may be created (its first chunk); with False, a stream
        that is gone (the front door deleted it) stays gone. Returns whether nobody reads the job's results any more (its
        client left a cancel mark, or the front door deleted the stream).
        """
        if self._task is None or self._task.done():
            raise RuntimeError("the result writer is not running")
        write = _Write(job_id, payload, ack, create)
        self._pending.append(write)
        self._has_pending.set()
        return await write.done

    async def _run(self) -> None:
        # Every write handed over before stop() is flushed and answered: no caller waits forever.
        while not (self._stopping and not self._pending):
            await self._has_pending.wait()
            self._has_pending.clear()
            if self._pending:
                batch, self._pending = self._pending, []
                await self._write(batch)

    async def _write(self, batch: list[_Write]) -> None:
        for delay_s in (*RETRY_DELAYS_S, None):
            try:
                cancelled = await self._flush(batch)
                break
            except Exception as exc:
                if delay_s is not None:
                    logger.warning("writing result chunks failed; retrying", extra={"chunks": len(batch)})
                    self._script_sha = None  # Redis may have restarted without the script
                    await asyncio.sleep(delay_s)
                    continue
                logger.exception("writing result chunks failed", extra={"chunks": len(batch)})
                for write in batch:
                    if not write.done.done():  # its caller may have been cancelled meanwhile
                        write.done.set_exception(exc)
                return
        for write, is_cancelled in zip(batch, cancelled, strict=True):
            if not write.done.done():
                write.done.set_result(is_cancelled)

    async def _flush(self, batch: list[_Write]) -> list[bool]:
        if self._script_sha is None:
            self._script_sha = await self._redis.script_load(APPEND_SCRIPT)
        pipe = self._redis.pipeline(transaction=False)
        for write in batch:
            stream = keys.result_stream(write.job_id)
            job_stream, entry_id = write.ack if write.ack is not None else (stream, b"")
            pipe.evalsha(
                self._script_sha,
                3,
                stream,
                keys.cancel_mark(write.job_id),
                job_stream,
                write.payload,
                keys.RESULT_TTL_S,
                int(write.create),
                entry_id,
                keys.JOB_GROUP,
            )
        return [bool(gone) for gone in await pipe.execute()]
