"""Jobs left behind: a dead worker's jobs go back in line; jobs that cannot run go to the dead letters.

A worker that dies mid-job leaves the job pending in its model's consumer group, delivered to a
consumer (the dead worker's id) that will never acknowledge it. Every worker looks over the job
streams of the models it may hold: an entry idle for at least the heartbeat TTL whose consumer has
no worker record any more is claimed (`XCLAIM` with that minimum idle time, so that one worker
wins and a slow live worker is never robbed) and put back at the end of its stream as a new entry
that remembers how many workers took the job before. Waiting again, it is seen by the model
controllers, so some worker loads the model even if the dead worker was its only holder; the
worker that takes it continues the answer where the client's stream stopped (`workers.jobs.continuation`).
A job taken `max_deliveries` times is given up instead: its client gets an error, and the job
goes to the dead-letter stream.
"""

from __future__ import annotations

import logging
from collections.abc import Container
from dataclasses import dataclass
from typing import Any, cast

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from switchboard import keys, live_workers, lua
from switchboard.wire import Chunk, Job, JobError, encode, job_decoder
from workers.jobs.writer import ResultWriter, inbox_of

logger = logging.getLogger(__name__)

# Entry fields as redis-py reads them: the job, and how many workers took it before it was put
# back in line (absent: none).
_JOB = keys.JOB_FIELD.encode()
_TAKEN = keys.TAKEN_FIELD.encode()
# Pending entries looked at per stream and sweep.
PENDING_SCAN = 100


@dataclass(frozen=True)
class Entry:
    """One job as read from its model's stream."""

    stream: str
    entry_id: bytes
    payload: bytes
    job: Job
    # How many workers took the job before this one (they died running it).
    taken_before: int
    # Put back in line (by a takeover or a worker that stopped): part of it may have been sent.
    requeued: bool

    @property
    def ack(self) -> tuple[str, bytes]:
        """What the job's last chunk acknowledges."""
        return (self.stream, self.entry_id)


def decode_entry(stream: str, entry_id: bytes, fields: dict[bytes, bytes]) -> Entry:
    """The job of a stream entry; KeyError or msgspec.DecodeError if the entry holds none."""
    payload = fields[_JOB]
    job = job_decoder.decode(payload)
    return Entry(stream, entry_id, payload, job, taken_before(fields), requeued=_TAKEN in fields)


def taken_before(fields: dict[bytes, bytes]) -> int:
    """How many workers took the job of this entry before (0 for a job never taken over)."""
    try:
        return int(fields.get(_TAKEN, b"0"))
    except ValueError:
        return 0


async def acknowledge(redis: aioredis.Redis, stream: str, entry_id: bytes, job_id: str) -> None:
    """End a job without writing to its result stream: acknowledge it, drop it and its cancel mark."""
    pipe = redis.pipeline(transaction=True)
    pipe.xack(stream, keys.JOB_GROUP, entry_id)
    pipe.xdel(stream, entry_id)
    pipe.delete(keys.cancel_mark(job_id))
    await pipe.execute()


async def dead_letter(
    redis: aioredis.Redis,
    stream: str,
    entry_id: bytes,
    fields: dict[bytes, bytes],
    *,
    reason: str,
    worker_id: str,
    acknowledge: bool = True,
) -> None:
    """Keep an entry on the dead-letter stream with `reason`; acknowledge and drop it from its stream."""
    logger.error(
        "job given up; kept on the dead-letter stream",
        extra={"stream": stream, "entry_id": entry_id.decode(), "reason": reason},
    )
    letter = {
        _JOB: fields.get(_JOB, b""),
        b"stream": stream.encode(),
        b"entry": entry_id,
        b"reason": reason.encode(),
        b"worker": worker_id.encode(),
    }
    pipe = redis.pipeline(transaction=True)
    pipe.xadd(keys.dead_letter_stream(), letter, maxlen=keys.DEAD_LETTER_MAXLEN, approximate=True)  # type: ignore[arg-type]
    pipe.expire(keys.dead_letter_stream(), keys.DEAD_LETTER_TTL_S)
    if acknowledge:
        pipe.xack(stream, keys.JOB_GROUP, entry_id)
        pipe.xdel(stream, entry_id)
    await pipe.execute()


class Takeover:
    """Finds the jobs of dead workers on some job streams and puts them back in line (or gives up)."""

    def __init__(
        self, redis: aioredis.Redis, writer: ResultWriter, *, worker_id: str, max_deliveries: int
    ) -> None:
        self._redis = redis
        self._writer = writer
        self._worker_id = worker_id
        self._max_deliveries = max_deliveries
        self._requeue = lua.register(redis, "requeue")

    async def requeue(self, stream: str, entry_id: bytes, payload: bytes, taken: int) -> bool:
        """Put a job back at the end of its stream as a new entry, remembering `taken`; drop the old one.

        Returns False (and puts nothing back) when the entry was acknowledged meanwhile.
        """
        requeued = await self._requeue(keys=[stream], args=[entry_id, payload, taken, keys.JOB_GROUP])
        return bool(requeued)

    async def sweep(self, streams: list[str], running: Container[bytes]) -> int:
        """Take over what dead workers left pending on `streams`; returns how many jobs.

        `running`: the entry ids this worker is running. An entry pending on this worker that it
        does not run (its result could not be written) is left behind too.
        """
        taken = 0
        for stream in streams:
            try:
                taken += await self._sweep_stream(stream, running)
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):  # a stream that expired has nothing pending
                    raise
        return taken

    async def _sweep_stream(self, stream: str, running: Container[bytes]) -> int:
        min_idle_ms = int(keys.WORKER_TTL_S * 1000)
        pending: list[dict[str, Any]] = await self._redis.xpending_range(
            stream, keys.JOB_GROUP, min="-", max="+", count=PENDING_SCAN, idle=min_idle_ms
        )
        if not pending:
            return 0
        consumers = sorted({_name(entry["consumer"]) for entry in pending} - {self._worker_id})
        alive = await live_workers.alive_among(self._redis, consumers)
        alive.add(self._worker_id)
        orphans = {
            entry["message_id"]: entry
            for entry in pending
            if _name(entry["consumer"]) not in alive
            or (_name(entry["consumer"]) == self._worker_id and entry["message_id"] not in running)
        }
        if not orphans:
            return 0
        # Only entries still idle that long are claimed: of two workers sweeping at once, one wins.
        claimed = cast(
            list[tuple[bytes, dict[bytes, bytes] | None]],
            await self._redis.xclaim(stream, keys.JOB_GROUP, self._worker_id, min_idle_ms, list(orphans)),
        )
        for entry_id, fields in claimed:
            if fields is None:  # deleted from the stream meanwhile: nothing left to run
                await self._redis.xack(stream, keys.JOB_GROUP, entry_id)
                continue
            dead_worker = _name(orphans[entry_id]["consumer"])
            taken = taken_before(fields) + int(orphans[entry_id]["times_delivered"])
            await self._take_over(stream, entry_id, fields, taken, dead_worker)
        return len(claimed)

    async def _take_over(
        self, stream: str, entry_id: bytes, fields: dict[bytes, bytes], taken: int, dead_worker: str
    ) -> None:
        if taken < self._max_deliveries:
            logger.warning(
                "taking over a job of a dead worker",
                extra={
                    "stream": stream,
                    "entry_id": entry_id.decode(),
                    "dead_worker": dead_worker,
                    "taken": taken,
                },
            )
            await self.requeue(stream, entry_id, fields.get(_JOB, b""), taken)
            return
        reason = f"taken by {taken} workers, and each stopped before finishing it"
        try:
            job = job_decoder.decode(fields[_JOB])
        except (KeyError, msgspec.DecodeError):
            await dead_letter(self._redis, stream, entry_id, fields, reason=reason, worker_id=self._worker_id)
            return
        await dead_letter(
            self._redis, stream, entry_id, fields, reason=reason, worker_id=self._worker_id, acknowledge=False
        )
        error = JobError(
            code="engine_error",
            message=(
                f"Job {job.id} failed on {taken} workers (each stopped before finishing it); "
                "it was given up. Retry the request; if it fails again, tell the operator."
            ),
        )
        if await self._redis.exists(keys.cancel_mark(job.id)):
            await acknowledge(self._redis, stream, entry_id, job.id)  # nobody waits for an answer
            return
        await self._writer.append(
            job.id, encode(Chunk(error=error)), ack=(stream, entry_id), create=True, inbox=inbox_of(job)
        )


def _name(consumer: bytes | str) -> str:
    return consumer.decode() if isinstance(consumer, bytes) else consumer
