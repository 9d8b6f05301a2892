"""The heartbeat knows whether the worker's record is sure to be in Redis: what lets the worker send
chunks over a front door's lane (workers.jobs.lane), where no fence of Redis's stops a stale worker."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from switchboard import keys
from tests.support.front_door_harness import worker_record
from workers.runtime import heartbeat as heartbeat_module
from workers.runtime.heartbeat import Heartbeat

RECORD = worker_record("w1")


async def test_the_record_is_fresh_after_a_beat_and_not_once_withdrawn(redis: aioredis.Redis) -> None:
    healthy = True
    heartbeat = Heartbeat(redis, lambda: RECORD, interval_s=60, healthy=lambda: healthy)
    assert not heartbeat.fresh()  # never beaten
    await heartbeat.start()
    assert heartbeat.fresh()
    assert await redis.exists(keys.worker_record("w1"))
    healthy = False
    await heartbeat.beat()  # withdraws the record
    assert not heartbeat.fresh()
    assert not await redis.exists(keys.worker_record("w1"))
    await heartbeat.stop()


async def test_the_record_goes_stale_well_before_redis_lets_it_expire(
    redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    heartbeat = Heartbeat(redis, lambda: RECORD, interval_s=60)
    await heartbeat.start()
    sent = time.monotonic()
    ttl_ms = await redis.pttl(keys.worker_record("w1"))
    # Later, with every beat since failing (Redis unreachable, say): stale before the TTL runs out.
    later = sent + keys.WORKER_TTL_S - heartbeat_module.FRESH_MARGIN_S + 0.01
    monkeypatch.setattr(heartbeat_module.time, "monotonic", lambda: later)
    assert not heartbeat.fresh()
    assert later - sent < ttl_ms / 1000
    monkeypatch.setattr(heartbeat_module.time, "monotonic", lambda: sent + 1)
    assert heartbeat.fresh()

    async def unreachable(*_: object, **__: object) -> None:
        raise RedisConnectionError("down")

    monkeypatch.setattr(type(redis.pipeline()), "execute", unreachable)
    monkeypatch.setattr(heartbeat_module.time, "monotonic", lambda: later)
    with pytest.raises(RedisConnectionError):
        await heartbeat.beat()
    assert not heartbeat.fresh(), "a beat that failed refreshes nothing"
    monkeypatch.undo()
    await heartbeat.stop()
