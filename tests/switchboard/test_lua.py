"""Every Redis script is a file of switchboard/lua/ that says its KEYS and ARGV at its top; what the
scripts that guard a job's keys against a Redis that lost them do, against a real Redis."""

from __future__ import annotations

from importlib import resources

import pytest
import redis.asyncio as aioredis

from router.queue.enqueue import JobQueue
from switchboard import keys, lua
from switchboard.tasks import TaskSet
from switchboard.wire import Chunk, encode

SCRIPTS = sorted(
    entry.name.removesuffix(".lua")
    for entry in resources.files("switchboard.lua").iterdir()
    if entry.name.endswith(".lua")
)


def test_the_folder_holds_scripts() -> None:
    assert {"cancel", "jobs_waiting"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_documents_its_keys_at_its_top(name: str) -> None:
    text = lua.source(name)
    header = [line for line in text.splitlines() if line.startswith("--")]
    assert text.removeprefix("#!lua\n").startswith("--"), name  # a shebang may come first
    assert any("KEYS" in line for line in header), name


async def append_first_chunk(redis: aioredis.Redis, job_id: str) -> int:
    """A worker's first chunk for `job_id` (position 0), as its result writer sends it."""
    script = lua.register(redis, "append_chunk")
    results = keys.result_stream(job_id)
    script_keys = [results, keys.cancel_mark(job_id), results, keys.job_record(job_id), results]
    args = [encode(Chunk(text="Hel")), keys.RESULT_TTL_S, "1", "", keys.JOB_GROUP, 0, "w1", "1", "", 60]
    return int(await script(keys=script_keys, args=args))


async def test_a_first_chunk_creates_results_only_for_a_job_whose_record_exists(
    redis: aioredis.Redis,
) -> None:
    # A job taken before Redis restarted without it: nobody reads its results, and none are made.
    assert await append_first_chunk(redis, "lost") == 1
    assert not await redis.exists(keys.result_stream("lost"))
    await redis.hset(keys.job_record("queued"), keys.READERS_FIELD, 1)
    assert await append_first_chunk(redis, "queued") == 0
    assert await redis.xlen(keys.result_stream("queued")) == 1


async def test_stepping_away_never_writes_a_lost_record_again(redis: aioredis.Redis) -> None:
    queue = JobQueue(redis, TaskSet("test"))
    assert await queue.step_away("lost") == 0
    assert not await redis.exists(keys.job_record("lost"))
    await redis.hset(keys.job_record("kept"), mapping={keys.READERS_FIELD: 2})
    assert await queue.step_away("kept") == 1
    assert await queue.step_away("kept") == 2
    assert await redis.hget(keys.job_record("kept"), keys.READERS_FIELD) == b"0"
    assert 0 < await redis.ttl(keys.job_record("kept")) <= keys.RESULT_TTL_S
