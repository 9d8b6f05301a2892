"""The consumer's reads of the model streams, each stream with the count its model was allotted.

Redis counts an XREADGROUP's COUNT per stream, so one read over several streams with the free slots
as its count could take that many from each. Two shapes keep a read within what it may take:

- `read_each`: one non-blocking XREADGROUP per stream, each with its own count, in one round trip
  (a pipeline: a blocking command in one would hold the others back);
- `read_blocking`: one XREADGROUP over the streams, blocking until a job comes, with a count no
  stream's allotment is below (the smallest of them).

Between two reads the jobs the first one started go into Triton (`let_taken_jobs_start`).

A stream whose consumer group is gone (it expired, or Redis restarted empty) is named in the
result, so that its group is made again; what the other streams gave is kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from switchboard import keys
from switchboard.redis_conn import stream_entries

StreamEntry = tuple[bytes, dict[bytes, bytes]]

# Turns of the event loop between one read and the next: one for the first steps of the jobs a read
# started, one for the Triton stream's writer that they wake.
TURNS_BEFORE_NEXT_READ = 2


@dataclass
class ReadResult:
    """What one read gave, by stream, and the streams that had no consumer group."""

    entries: dict[str, list[StreamEntry]] = field(default_factory=dict)
    without_group: list[str] = field(default_factory=list)

    def count(self, stream: str) -> int:
        """Jobs the stream gave."""
        return len(self.entries.get(stream, ()))


async def read_each(redis: aioredis.Redis, consumer: str, counts: Mapping[str, int]) -> ReadResult:
    """Take up to `counts[stream]` jobs from each stream, without waiting, in one round trip."""
    pipe = redis.pipeline(transaction=False)
    for stream, count in counts.items():
        pipe.xreadgroup(keys.JOB_GROUP, consumer, {stream: ">"}, count=count)
    replies = await pipe.execute(raise_on_error=False)
    result = ReadResult()
    for stream, reply in zip(counts, replies, strict=True):
        if isinstance(reply, BaseException):
            if not _no_group(reply):
                raise reply
            result.without_group.append(stream)
            continue
        _keep(result, reply)
    return result


async def read_blocking(
    redis: aioredis.Redis, consumer: str, counts: Mapping[str, int], block_ms: int
) -> ReadResult:
    """Wait up to `block_ms` for jobs on any of the streams; takes at most `counts[stream]` from each."""
    try:
        reply = await redis.xreadgroup(
            keys.JOB_GROUP,
            consumer,
            {stream: ">" for stream in counts},  # type: ignore[misc]
            count=min(counts.values()),
            block=block_ms,
        )
    except ResponseError as exc:
        if not _no_group(exc):
            raise
        return ReadResult(without_group=list(counts))
    result = ReadResult()
    _keep(result, reply)
    return result


async def let_taken_jobs_start() -> None:
    """Let the jobs a read started send themselves into Triton before the next read goes out: its
    command costs the loop a few hundred microseconds, which each new job's first token waited behind."""
    for _ in range(TURNS_BEFORE_NEXT_READ):
        await asyncio.sleep(0)


def _keep(result: ReadResult, reply: object) -> None:
    for stream, entries in stream_entries(reply):
        result.entries.setdefault(stream.decode(), []).extend(entries)


def _no_group(error: BaseException) -> bool:
    return isinstance(error, ResponseError) and "NOGROUP" in str(error)
