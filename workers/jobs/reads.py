"""The consumer's reads of the model streams, each stream with the count its model was allotted.

A model's jobs wait in one stream per tier (`wire.TIERS`). Redis counts an XREADGROUP's COUNT per
stream, so one read over several streams with the free slots as its count could take that many from
each. Two shapes keep a read within what it may take:

- `read_each`: for each model, one script (`lua/take_in_order.lua`) that takes its allotment from
  its tiers' streams in order, all in one round trip (a pipeline: a blocking command in one would
  hold the others back);
- `read_blocking`: one XREADGROUP over the interactive tiers' streams (batch lines wait for no
  one, so no read blocks for them), blocking until a job comes, with a count no model's allotment
  is below (the smallest of them). When jobs of several tiers of one model arrive in the same
  instant it can take more of that model than its allotment: the consumer hands those back.

Between two reads the jobs the first one started go into Triton (`let_taken_jobs_start`).

A stream whose consumer group is gone (it expired, or Redis restarted empty) is named in the
result, so that its group is made again; what the other streams gave is kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from switchboard import keys
from switchboard.redis_conn import stream_entries

StreamEntry = tuple[bytes, dict[bytes, bytes]]

# Turns of the event loop between one read and the next: one for the first steps of the jobs a read
# started, one for the Triton stream's writer that they wake.
TURNS_BEFORE_NEXT_READ = 2


@dataclass(frozen=True)
class Take:
    """What one read may take of one model: `count` jobs from its `streams` in order, of them at most
    `batch` from the last, its batch tier's (0: the batch stream is not read)."""

    streams: tuple[str, ...]
    count: int
    batch: int = 0

    def caps(self) -> list[int]:
        """The most jobs each stream may give."""
        return [self.count] * (len(self.streams) - 1) + [self.batch]


@dataclass
class ReadResult:
    """What one read gave, by stream, and the streams that had no consumer group."""

    entries: dict[str, list[StreamEntry]] = field(default_factory=dict)
    without_group: list[str] = field(default_factory=list)

    def count(self, stream: str) -> int:
        """Jobs the stream gave."""
        return len(self.entries.get(stream, ()))


async def read_each(
    redis: aioredis.Redis, script: AsyncScript, consumer: str, takes: Mapping[str, Take]
) -> ReadResult:
    """Take up to each model's allotment from its streams in order, without waiting, in one round
    trip; `script` is `take_in_order` registered on `redis`."""
    pipe = redis.pipeline(transaction=False)
    for take in takes.values():
        await script(
            keys=list(take.streams), args=[keys.JOB_GROUP, consumer, take.count, *take.caps()], client=pipe
        )
    replies = await pipe.execute(raise_on_error=False)
    result = ReadResult()
    for take, reply in zip(takes.values(), replies, strict=True):
        if isinstance(reply, BaseException):
            raise reply
        for stream, entries in zip(take.streams, reply, strict=True):
            if entries == b"NOGROUP":
                result.without_group.append(stream)
            elif entries:
                result.entries.setdefault(stream, []).extend(_entry(entry) for entry in entries)
    return result


def _entry(raw: list[Any]) -> StreamEntry:
    """One entry as a script returns it: its id and a flat list of fields and values."""
    entry_id, flat = raw
    return entry_id, dict(zip(flat[::2], flat[1::2], strict=True))


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
