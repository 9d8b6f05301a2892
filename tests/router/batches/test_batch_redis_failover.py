"""A batch running while its Redis primary is killed and Sentinel promotes the replica finishes with
every `custom_id` exactly once: the runner's lease, the batch's record and its finished lines live in
Redis, and what the new primary has is enough to go on (a line whose result the failover lost runs
again, once). A real primary, replica and three sentinels; a real front door with the official
`openai` client; a stand-in worker that answers every job through its own Sentinel client and rides
out the failover as a worker's retries do."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from router.batches import runner as runner_module
from switchboard import keys
from switchboard.redis_conn import pooled_client, stream_entries
from switchboard.wire import TIERS, Chunk, Usage, job_decoder
from tests.support.front_door_harness import (
    MODEL,
    advertise,
    serving,
    settings_for,
    worker_record,
    write_chunks,
)
from tests.support.sentinel import SentinelTopology

LINES = 80


@pytest.fixture
def topology() -> Iterator[SentinelTopology]:
    with SentinelTopology() as started:
        yield started


@contextlib.asynccontextmanager
async def riding_worker(redis: aioredis.Redis) -> AsyncIterator[None]:
    """Answer every job of MODEL in every tier, 20 ms each; a Redis error waits and tries again, and
    then answers the jobs it had taken (pending to it), as a worker goes on with the jobs it runs."""
    fresh: dict[Any, Any] = dict.fromkeys(keys.job_streams(MODEL, TIERS), ">")
    own: dict[Any, Any] = dict.fromkeys(keys.job_streams(MODEL, TIERS), "0")
    recovering = False

    async def loop() -> None:
        nonlocal recovering
        while True:
            try:
                await advertise(redis, worker_record("w1"))
                for stream in fresh:
                    with contextlib.suppress(ResponseError):  # BUSYGROUP
                        await redis.xgroup_create(stream, keys.JOB_GROUP, id="0", mkstream=True)
                streams = own if recovering else fresh
                response = await redis.xreadgroup(keys.JOB_GROUP, "w1", streams, count=4, block=100)
                recovering = recovering and any(entries for _, entries in stream_entries(response))
                for stream, entries in stream_entries(response):
                    for entry_id, fields in entries:
                        job = job_decoder.decode(fields[keys.JOB_FIELD.encode()])
                        await asyncio.sleep(0.02)
                        last = Chunk(
                            text="x", finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=1)
                        )
                        await write_chunks(redis, job.id, last)
                        await redis.xack(stream, keys.JOB_GROUP, entry_id)
                        await redis.xdel(stream, entry_id)
            except RedisError:
                recovering = True
                await asyncio.sleep(0.1)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_batch_goes_on_through_a_failover_and_answers_every_line_once(
    topology: SentinelTopology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "RETRY_AFTER_S", 0.2)
    settings = settings_for(topology.url, timeout_s=120)
    settings.files.store = str(tmp_path / "files")
    settings.batches.max_lines_in_flight = 4
    worker = pooled_client(topology.url)
    rows = [
        {
            "custom_id": f"q-{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": f"Hi {n}"}], "max_tokens": 2},
        }
        for n in range(LINES)
    ]
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    async with serving(settings) as http, riding_worker(worker), asyncio.timeout(120):
        client = openai.AsyncOpenAI(base_url=f"{http.base_url}/v1", api_key="unused", max_retries=3)
        uploaded = await client.files.create(file=("in.jsonl", data), purpose="batch")
        batch = await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        while (await client.batches.retrieve(batch.id)).request_counts.completed < LINES // 4:  # type: ignore[union-attr]  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        assert await worker.execute_command("WAIT", 1, 2000) == 1
        old = topology.kill_primary()
        killed_at = time.monotonic()
        await asyncio.to_thread(topology.wait_promoted, old.port)
        while True:
            try:
                batch = await client.batches.retrieve(batch.id)
            except openai.APIStatusError:
                batch = None  # type: ignore[assignment]
            if batch is not None and batch.status in ("completed", "failed", "expired", "cancelled"):
                break
            if batch is not None and time.monotonic() - killed_at > 50:
                pytest.fail(
                    f"the batch did not finish after the failover: {batch.status} {batch.request_counts}"
                )
            await asyncio.sleep(0.1)
        print(f"\nkill -> batch completed {time.monotonic() - killed_at:.1f} s")
        assert batch.status == "completed" and batch.output_file_id is not None
        output = (await client.files.content(batch.output_file_id)).text.splitlines()
        await client.close()
    await worker.aclose()
    custom_ids = [json.loads(line)["custom_id"] for line in output]
    assert custom_ids == [f"q-{n}" for n in range(LINES)]  # every line once, in the input's order
    assert batch.error_file_id is None
