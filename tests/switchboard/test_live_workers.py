"""Who is alive, read from a real Redis as the heartbeat writes it: a fresh score and a record that
has not expired."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from switchboard import keys, live_workers
from switchboard.wire import WorkerRecord, encode


def record(worker_id: str) -> WorkerRecord:
    now = time.time()
    return WorkerRecord(
        id=worker_id,
        host="h",
        pid=1,
        started=now,
        heartbeat=now,
        models=(),
        triton_http_port=1,
        triton_grpc_port=2,
        triton_metrics_port=3,
    )


async def beat(redis: aioredis.Redis, worker_id: str, at: float) -> None:
    """What a worker's heartbeat writes: its record, and its id scored by when it beat."""
    await redis.set(keys.worker_record(worker_id), encode(record(worker_id)), ex=keys.WORKER_TTL_S)
    await redis.zadd(keys.workers_index(), {worker_id: at})


async def test_only_workers_with_a_fresh_beat_and_a_record_are_alive(redis: aioredis.Redis) -> None:
    now = time.time()
    await beat(redis, "fresh", now)
    await beat(redis, "stale", now - keys.WORKER_TTL_S - 5)  # stopped beating
    await beat(redis, "expired", now)
    await redis.delete(keys.worker_record("expired"))  # its record expired since it beat
    assert [r.id for r in await live_workers.read_live(redis)] == ["fresh"]


async def test_a_worker_reads_the_others_and_not_itself(redis: aioredis.Redis) -> None:
    for worker_id in ("me", "other"):
        await beat(redis, worker_id, time.time())
    assert [r.id for r in await live_workers.read_live(redis, besides="me")] == ["other"]


async def test_an_unreadable_record_is_logged_and_left_out(
    redis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    await beat(redis, "good", time.time())
    await beat(redis, "garbled", time.time())
    await redis.set(keys.worker_record("garbled"), b"\xc1not msgpack")
    pipe = redis.pipeline(transaction=False)
    live_workers.add_ids_read_to(pipe, time.time())
    (worker_ids,) = await pipe.execute()
    assert [r.id for r in await live_workers.read_records(redis, worker_ids)] == ["good"]
    assert "unreadable worker record" in caplog.text


async def test_a_worker_is_alive_while_its_record_has_not_expired(redis: aioredis.Redis) -> None:
    await beat(redis, "beating", time.time())
    await beat(redis, "gone", time.time())
    await redis.delete(keys.worker_record("gone"))
    assert await live_workers.alive_among(redis, ["beating", "gone", "never"]) == {"beating"}
