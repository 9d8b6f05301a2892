"""A batch whose runner's front door goes away mid-run is finished by another front door: the lease
passes on, the new runner reads the results so far and runs only the lines not finished, and the
output holds every `custom_id` exactly once (real Redis, real front doors, a stand-in worker that
answers every job)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from router.batches import runner as runner_module
from router.batches.records import BatchRecord, BatchRecords, new_batch_id
from router.front_door import FrontDoor
from switchboard.local.redis_server import PrivateRedis
from tests.support import live_front_door
from tests.support.batch_files import uploaded
from tests.support.front_door_harness import MODEL, settings_for
from tests.support.live_front_door import ANSWER, answering_every_job
from tests.support.waits import eventually

LINES = 60


async def test_another_front_door_finishes_a_batch_whose_runner_went_away(
    redis: aioredis.Redis, redis_server: PrivateRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "LEASE_S", 1.0)
    monkeypatch.setattr(runner_module, "IDLE_PASS_S", 0.2)
    # The stand-in worker answers a job every 20 ms, so that the batch is mid-run when its door goes.
    answer_now = live_front_door.write_chunks

    async def answer_slowly(*args: Any) -> None:
        await asyncio.sleep(0.02)
        await answer_now(*args)

    monkeypatch.setattr(live_front_door, "write_chunks", answer_slowly)
    settings = settings_for(redis_server.url)
    settings.files.store = str(tmp_path / "files")
    settings.batches.max_lines_in_flight = 2
    batches = BatchRecords(redis)
    now = time.time()
    batch = BatchRecord(
        id=new_batch_id(), owner="", input_file_id=await uploaded(redis, tmp_path / "files", model=MODEL, lines=LINES),
        endpoint="/v1/chat/completions", status="validating", created_at=now, expires_at=now + 86400,
    )  # fmt: skip
    async with answering_every_job(redis):
        first = await FrontDoor.open(settings)
        await batches.add(batch)

        async def some_finished() -> bool:
            return len(await batches.finished_ids(batch.id)) >= 10

        await eventually(some_finished, timeout_s=30, what="a tenth of the lines to finish")
        await first.close()  # its lines in flight end unrecorded; its lease runs out
        halfway = len(await batches.finished_ids(batch.id))
        assert 10 <= halfway < LINES
        second = await FrontDoor.open(settings)

        async def completed() -> bool:
            done = await batches.get(batch.id)
            return done is not None and done.status == "completed"

        try:
            await eventually(completed, timeout_s=60, what="the second front door to finish the batch")
        finally:
            await second.close()
    ended = await batches.get(batch.id)
    assert ended is not None
    assert (ended.total, ended.completed, ended.failed) == (LINES, LINES, 0)
    output = (Path(settings.files.store) / str(ended.output_file_id)).read_text().splitlines()
    rows = [json.loads(text) for text in output]
    assert [row["custom_id"] for row in rows] == [f"q-{n}" for n in range(LINES)]
    assert all(row["response"]["body"]["choices"][0]["message"]["content"] == ANSWER for row in rows)
