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

# What the append script answers for one chunk.
READ = 0  # written (or found written by an earlier try), and its client still reads
GONE = 1  # nobody reads the job's results any more: its cancel mark, or its result stream deleted
SUPERSEDED = 2  # another worker writes the job's results now (it took the job over)

# KEYS: result stream, cancel mark, job stream (the result stream again when nothing is acked), job record.
# ARGV: chunk, result TTL, "1" if the chunk may create the result stream, entry id to acknowledge
# ("" for none), consumer group, the chunk's position in the results (-1: after the last one),
# writer (the worker's id), "1" for the first chunk this writer writes for the job.
#
# A chunk at position n is entry `0-(n+1)`, so appends are idempotent: a flush retried after a
# lost reply (by this writer or by redis-py) finds its chunk there, written by itself, and writes
# nothing twice. They are fenced too: a worker that stalled past its heartbeat, while another took
# its job over, finds the other's chunks at or after its position and stops (SUPERSEDED); only a
# writer's first chunk for the job may follow another writer's (that is the takeover).
# Only a job's first chunk may create its result stream: a stream the front door deleted (its
# client left, or it read the last chunk) is never brought back by a late chunk.
APPEND_SCRIPT = """
local function writer_of(fields)
  for i = 1, #fields, 2 do
    if fields[i] == 'w' then return fields[i + 1] end
  end
  return false
end
local status = 0
if redis.call('EXISTS', KEYS[1]) == 0 and ARGV[3] ~= '1' then
  status = 1
else
  local last, last_writer = 0, false
  local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
  if #top > 0 then
    last = tonumber(string.match(top[1][1], '%-(%d+)$'))
    last_writer = writer_of(top[1][2])
  end
  local seq = tonumber(ARGV[6])
  local position = seq + 1
  if seq < 0 then
    position = last + 1
  end
  if position <= last then
    local there = redis.call('XRANGE', KEYS[1], '0-' .. position, '0-' .. position)
    if #there == 0 or writer_of(there[1][2]) ~= ARGV[7] then
      return 2
    end
  elseif seq >= 0 and last_writer and last_writer ~= ARGV[7] and ARGV[8] ~= '1' then
    return 2
  else
    redis.call('XADD', KEYS[1], '0-' .. position, 'c', ARGV[1], 'w', ARGV[7])
    redis.call('EXPIRE', KEYS[1], ARGV[2])
  end
end
if ARGV[4] ~= '' then
  redis.call('XACK', KEYS[3], ARGV[5], ARGV[4])
  redis.call('XDEL', KEYS[3], ARGV[4])
  redis.call('DEL', KEYS[2])
  -- Ended: a cancel mark left from now on would be for nobody (switchboard.cancel_marks).
  if redis.call('EXISTS', KEYS[4]) == 1 then
    redis.call('HSET', KEYS[4], 'done', 1)
  end
  return status
end
if status == 1 then
  return 1
end
return redis.call('EXISTS', KEYS[2])
"""


class Superseded(Exception):
    """Another worker took the job over and writes its results now: this worker must stop it."""


class _Write:
    __slots__ = ("ack", "create", "done", "first", "job_id", "payload", "seq")

    def __init__(
        self,
        job_id: str,
        payload: bytes,
        ack: tuple[str, bytes] | None,
        create: bool,
        seq: int | None,
        first: bool,
    ) -> None:
        self.job_id = job_id
        self.payload = payload
        self.ack = ack
        self.create = create
        self.seq = seq
        self.first = first
        self.done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()


class ResultWriter:
    """Batches chunk appends of all jobs of one worker into pipelines."""

    def __init__(self, redis: aioredis.Redis, writer_id: str = "") -> None:
        self._redis = redis
        # Marks every chunk written, so that a retried flush recognises its own chunks.
        self._writer_id = writer_id
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
        self,
        job_id: str,
        payload: bytes,
        *,
        ack: tuple[str, bytes] | None = None,
        create: bool = True,
        seq: int | None = None,
        first: bool = False,
    ) -> bool:
        """Append one encoded chunk; `ack` = (job stream, entry id) for the job's last chunk.

        `seq`: the chunk's position in the job's results (0 for its first chunk), which makes the
        append idempotent and fenced (see APPEND_SCRIPT); None puts it after the last chunk (an
        error that ends the job). `first`: the first chunk this worker writes for the job, which
        may follow another worker's. `create`: the job's result stream may be created (implied by
        `seq == 0`); with False, a stream that is gone (the front door deleted it) stays gone.

        Returns whether nobody reads the job's results any more (its client left a cancel mark,
        or the front door deleted the stream). Raises Superseded when another worker took the job.
        """
        if self._task is None or self._task.done():
            raise RuntimeError("the result writer is not running")
        write = _Write(job_id, payload, ack, create if seq is None else seq == 0, seq, first)
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
                statuses = await self._flush(batch)
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
        for write, status in zip(batch, statuses, strict=True):
            if write.done.done():
                continue
            if status == SUPERSEDED:
                write.done.set_exception(
                    Superseded(f"another worker writes the results of job {write.job_id}")
                )
            else:
                write.done.set_result(status == GONE)

    async def _flush(self, batch: list[_Write]) -> list[int]:
        if self._script_sha is None:
            self._script_sha = await self._redis.script_load(APPEND_SCRIPT)
        pipe = self._redis.pipeline(transaction=False)
        for write in batch:
            stream = keys.result_stream(write.job_id)
            job_stream, entry_id = write.ack if write.ack is not None else (stream, b"")
            pipe.evalsha(
                self._script_sha,
                4,
                stream,
                keys.cancel_mark(write.job_id),
                job_stream,
                keys.job_record(write.job_id),
                write.payload,
                keys.RESULT_TTL_S,
                int(write.create),
                entry_id,
                keys.JOB_GROUP,
                -1 if write.seq is None else write.seq,
                self._writer_id,
                int(write.first),
            )
        return [int(status) for status in await pipe.execute()]
