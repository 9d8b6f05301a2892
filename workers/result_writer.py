"""Append result chunks of every running job to Redis, many jobs per round trip.

Each running job hands its chunk to the writer and awaits the flush. The writer sends whatever is
waiting as one pipeline the moment it is free, so a lone chunk leaves at once and chunks that pile
up while a flush is in flight share the next one. The same pipeline asks whether each job's client
has gone away (its cancel mark) and acknowledges jobs whose last chunk it carries.
"""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis

from switchboard import keys

logger = logging.getLogger(__name__)


class _Write:
    __slots__ = ("ack", "done", "job_id", "payload")

    def __init__(self, job_id: str, payload: bytes, ack: tuple[str, bytes] | None) -> None:
        self.job_id = job_id
        self.payload = payload
        self.ack = ack
        self.done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()


class ResultWriter:
    """Batches chunk appends of all jobs of one worker into pipelines."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._pending: list[_Write] = []
        self._has_pending = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

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

    async def append(self, job_id: str, payload: bytes, *, ack: tuple[str, bytes] | None = None) -> bool:
        """Append one encoded chunk; `ack` = (job stream, entry id) for the job's last chunk.

        Returns whether the job's client has left a cancel mark.
        """
        if self._task is None or self._task.done():
            raise RuntimeError("the result writer is not running")
        write = _Write(job_id, payload, ack)
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
        try:
            cancelled = await self._flush(batch)
        except Exception as exc:
            logger.exception("writing result chunks failed", extra={"chunks": len(batch)})
            for write in batch:
                if not write.done.done():  # its caller may have been cancelled meanwhile
                    write.done.set_exception(exc)
            return
        for write, is_cancelled in zip(batch, cancelled, strict=True):
            if not write.done.done():
                write.done.set_result(is_cancelled)

    async def _flush(self, batch: list[_Write]) -> list[bool]:
        pipe = self._redis.pipeline(transaction=False)
        exists_at: list[int] = []
        position = 0
        for write in batch:
            stream = keys.result_stream(write.job_id)
            pipe.xadd(stream, {"c": write.payload})
            # Renewed with every chunk: a stream the front door already deleted (its client left)
            # may be recreated by a late chunk, and must not outlive its TTL even if this worker dies.
            pipe.expire(stream, keys.RESULT_TTL_S)
            position += 2
            if write.ack is not None:
                job_stream, entry_id = write.ack
                pipe.xack(job_stream, keys.JOB_GROUP, entry_id)
                pipe.xdel(job_stream, entry_id)
                position += 2
            pipe.exists(keys.cancel_mark(write.job_id))
            exists_at.append(position)
            position += 1
        results = await pipe.execute()
        return [bool(results[i]) for i in exists_at]
