"""The batch runner queues a batch's lines in the batch tier, never more at once than the key's
`max_batch_lines_in_flight`, each with its batch's window as its deadline and none of the key's
request bounds; a batch whose window would not hold moves up to the flex tier, its waiting lines
with it (real Redis, a real front door, a worker advertised as warm that takes nothing, so the
lines stay where the runner put them)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from router.batches import runner as runner_module
from router.batches.records import BatchRecord, BatchRecords, new_batch_id
from switchboard import keys
from switchboard.config import ApiKey, Settings
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import Job, SlotStatus, job_decoder
from tests.support.batch_files import uploaded
from tests.support.front_door_harness import MODEL, advertise, front_door_of, settings_for, worker_record
from tests.support.waits import eventually

LINES = 12
SHA = hashlib.sha256(b"sb-batcher").hexdigest()


def batcher_settings(redis_url: str, tmp_path: Path, **batches: float) -> Settings:
    settings = settings_for(redis_url)
    settings.files.store = str(tmp_path / "files")
    # A key whose own bounds would stop a client at one request at a time.
    settings.auth.keys = [
        ApiKey(name="batcher", sha256=SHA, rpm=1, max_parallel=1, max_batch_lines_in_flight=3)
    ]
    for name, value in batches.items():
        setattr(settings.batches, name, value)
    return settings


async def start_batch(redis: aioredis.Redis, settings: Settings) -> BatchRecord:
    now = time.time()
    file_id = await uploaded(redis, Path(settings.files.store), model=MODEL, lines=LINES, owner=SHA)
    batch = BatchRecord(
        id=new_batch_id(), owner=SHA, input_file_id=file_id, endpoint="/v1/chat/completions",
        status="validating", created_at=now, expires_at=now + 86400,
    )  # fmt: skip
    await BatchRecords(redis).add(batch)
    return batch


async def queued(redis: aioredis.Redis, tier: str) -> list[Job]:
    entries = await redis.xrange(keys.job_stream(MODEL, tier))
    return [job_decoder.decode(fields[keys.JOB_FIELD.encode()]) for _, fields in entries]


async def test_lines_wait_in_the_batch_tier_within_the_keys_bound_with_the_batchs_window(
    redis_server: PrivateRedis, redis: aioredis.Redis, tmp_path: Path
) -> None:
    await advertise(redis, worker_record("w1", SlotStatus(model=MODEL, state="warm")))
    settings = batcher_settings(redis_server.url, tmp_path)
    batch = await start_batch(redis, settings)
    async with front_door_of(settings):

        async def three_queued() -> bool:
            return len(await queued(redis, "batch")) == 3

        await eventually(three_queued, timeout_s=10, what="three lines queued in the batch tier")
        await asyncio.sleep(1.0)  # passes go on: no fourth line while three are in flight
        lines = await queued(redis, "batch")
        assert len(lines) == 3 and await queued(redis, "default") == []
        assert all(line.tier == "batch" and abs(line.deadline - batch.expires_at) < 5 for line in lines)


async def test_a_batch_whose_window_would_not_hold_moves_up_to_flex(
    redis_server: PrivateRedis, redis: aioredis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "LEASE_S", 1.0)  # the second front door runs it soon
    await advertise(redis, worker_record("w1", SlotStatus(model=MODEL, state="warm")))
    # Lines already waiting in the batch tier (another batch's, say) move up with it.
    settings = batcher_settings(redis_server.url, tmp_path)
    await start_batch(redis, settings)
    async with front_door_of(settings):

        async def three_queued() -> bool:
            return len(await queued(redis, "batch")) == 3

        await eventually(three_queued, timeout_s=10, what="three lines queued in the batch tier")
    # A margin longer than the window: behind from the start.
    settings = batcher_settings(redis_server.url, tmp_path, deadline_margin_s=2 * 86400)
    async with front_door_of(settings):

        async def moved_up() -> bool:
            return await queued(redis, "batch") == [] and len(await queued(redis, "flex")) >= 3

        await eventually(moved_up, timeout_s=20, what="the waiting lines to move up to flex")
    assert {line.tier for line in await queued(redis, "flex")} == {"flex"}
