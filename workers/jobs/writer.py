"""Append result chunks of every running job to Redis, many jobs per round trip.

Each running job hands its chunk to the writer and awaits the flush. The writer sends whatever is
waiting as one pipeline the moment it is free, so a lone chunk leaves at once and chunks that pile
up while a flush is in flight share the next one. Each chunk is appended by a small script that
also tells whether the job's client has gone away (its cancel mark, or its result stream deleted)
and, with the job's last chunk, acknowledges the job and deletes its cancel mark.

A flush runs as one transaction (MULTI/EXEC), so that a front door blocked reading its jobs' result
streams wakes once the flush has run whole: in a plain pipeline Redis served it after the first
append, with that one chunk, and the rest waited for its next read. Now it wakes with every chunk the
flush added to the stream that woke it (Redis 7.2 and later: to every stream it reads).
"""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis

from switchboard import keys, lua
from switchboard.wire import Job

logger = logging.getLogger(__name__)

# A flush that fails is tried again after these pauses before its writers are told it failed.
RETRY_DELAYS_S = (0.05, 0.25)

# What the append script (switchboard/lua/append_chunk.lua) answers for one chunk, besides 0
# (written, and its client still reads).
GONE = 1  # nobody reads the job's results any more: its cancel mark, or its result stream deleted
SUPERSEDED = 2  # another worker writes the job's results now (it took the job over)


class Superseded(Exception):
    """Another worker took the job over and writes its results now: this worker must stop it."""


def inbox_of(job: Job) -> str | None:
    """The inbox of the front door that queued `job`, where its chunks are copied (`keys.inbox`)."""
    return keys.inbox(job.router_id) if job.router_id else None


class _Write:
    __slots__ = ("ack", "create", "done", "first", "inbox", "job_id", "payload", "seq")

    def __init__(
        self,
        job_id: str,
        payload: bytes,
        ack: tuple[str, bytes] | None,
        create: bool,
        seq: int | None,
        first: bool,
        inbox: str | None,
    ) -> None:
        self.job_id = job_id
        self.payload = payload
        self.ack = ack
        self.create = create
        self.seq = seq
        self.first = first
        self.inbox = inbox
        self.done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()


class ResultWriter:
    """Batches chunk appends of all jobs of one worker into pipelines."""

    def __init__(self, redis: aioredis.Redis, writer_id: str = "") -> None:
        # Marks every chunk written, so that a retried flush recognises its own chunks.
        self._writer_id = writer_id
        self._pending: list[_Write] = []
        self._has_pending = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._append = lua.register(redis, "append_chunk")
        # Runs it by its SHA alone: a pipeline that ran the registered script would ask Redis
        # whether it has it on every flush, a round trip more per chunk.
        self._scripts = lua.ScriptRunner(redis)

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
        inbox: str | None = None,
    ) -> bool:
        """Append one encoded chunk; `ack` = (job stream, entry id) for the job's last chunk; `inbox`:
        the front door's inbox that gets a copy (`inbox_of`).

        `seq`: the chunk's position in the job's results (0 for its first chunk), which makes the
        append idempotent and fenced (see switchboard/lua/append_chunk.lua); None puts it after the
        last chunk (an error that ends the job). `first`: the first chunk this worker writes for
        the job, which may follow another worker's. `create`: the job's result stream may be
        created (implied by `seq == 0`); with False, a stream that is gone (the front door deleted
        it) stays gone.

        Returns whether nobody reads the job's results any more (its client left a cancel mark,
        or the front door deleted the stream). Raises Superseded when another worker took the job.
        """
        if self._task is None or self._task.done():
            raise RuntimeError("the result writer is not running")
        write = _Write(job_id, payload, ack, create if seq is None else seq == 0, seq, first, inbox)
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
        def fill(calls: lua.Calls) -> None:
            for write in batch:
                stream = keys.result_stream(write.job_id)
                job_stream, entry_id = write.ack if write.ack is not None else (stream, b"")
                calls.add(
                    self._append,
                    [
                        stream,
                        keys.cancel_mark(write.job_id),
                        job_stream,
                        keys.job_record(write.job_id),
                        write.inbox or stream,
                    ],
                    [
                        write.payload,
                        keys.RESULT_TTL_S,
                        int(write.create),
                        entry_id,
                        keys.JOB_GROUP,
                        -1 if write.seq is None else write.seq,
                        self._writer_id,
                        int(write.first),
                        "" if write.inbox is None else keys.INBOX_MAX_ENTRIES,
                        keys.INBOX_TTL_S,
                    ],
                )

        # A transaction: see the module's description.
        return [int(status) for status in await self._scripts.run(fill, transaction=True)]
