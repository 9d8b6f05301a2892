"""Batch records in Redis (router/batches/records.py): a batch is its key's alone, its finished lines
are kept once each, and its counts follow them while it runs."""

from __future__ import annotations

import time

import msgspec
import pytest
import redis.asyncio as aioredis

from router.batches.records import (
    BatchRecord,
    BatchRecords,
    LineResult,
    NoSuchBatchError,
    cancelled,
    new_batch_id,
)
from switchboard import keys


def record(owner: str = "alice", status: str = "in_progress") -> BatchRecord:
    now = time.time()
    return BatchRecord(
        id=new_batch_id(),
        owner=owner,
        input_file_id="file-x",
        endpoint="/v1/chat/completions",
        status=status,  # type: ignore[arg-type]
        created_at=now,
        expires_at=now + 86400,
        total=3,
    )


async def test_a_batch_is_its_keys_alone(redis: aioredis.Redis) -> None:
    batches = BatchRecords(redis)
    mine = record()
    await batches.add(mine)
    assert (await batches.owned(mine.id, "alice")).id == mine.id
    for other in ("bob", ""):
        with pytest.raises(NoSuchBatchError):
            await batches.owned(mine.id, other)
    assert (await batches.page("bob", limit=10, after=None)) == ([], False)


async def test_a_line_is_kept_once_and_counted_while_the_batch_runs(redis: aioredis.Redis) -> None:
    batches = BatchRecords(redis)
    running = record()
    await batches.add(running)
    await batches.finish_line(running.id, "a", LineResult(ok=True, line=b'{"first": 1}'))
    await batches.finish_line(running.id, "a", LineResult(ok=False, line=b'{"again": 2}'))  # a rerun
    await batches.finish_line(running.id, "b", LineResult(ok=False, line=b'{"error": 1}'))
    kept = await batches.finished_lines(running.id)
    assert kept["a"].line == b'{"first": 1}' and not kept["b"].ok
    now = await batches.owned(running.id, "alice")
    assert (now.completed, now.failed) == (1, 1)


async def test_an_ended_batch_leaves_the_active_set_and_expires_with_its_results(
    redis: aioredis.Redis,
) -> None:
    batches = BatchRecords(redis)
    ended = record()
    await batches.add(ended)
    await batches.finish_line(ended.id, "a", LineResult(ok=True, line=b"{}"))
    assert await batches.active() == [ended.id]
    await batches.save(msgspec.structs.replace(ended, status="completed"))
    assert await batches.active() == []
    assert 0 < await redis.ttl(keys.batch_record(ended.id)) <= keys.BATCH_KEPT_S
    assert 0 < await redis.ttl(keys.batch_results(ended.id)) <= keys.BATCH_KEPT_S
    assert not await redis.exists(keys.batch_counts(ended.id))


async def test_a_change_is_written_only_over_the_status_it_was_made_from(redis: aioredis.Redis) -> None:
    """A cancel that lands while the runner moves a batch on is not overwritten, nor the other way."""
    batches = BatchRecords(redis)
    validating = record(status="validating")
    await batches.add(validating)
    assert await batches.save_if(cancelled(validating, time.time()), "validating")
    started = msgspec.structs.replace(validating, status="in_progress")
    assert not await batches.save_if(started, "validating")
    stored = await batches.get(validating.id)
    assert stored is not None and stored.status == "cancelling"
