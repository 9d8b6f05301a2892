"""Demand: the poke on the demand stream, and the index of models with work with its compare-and-remove."""

from __future__ import annotations

import redis.asyncio as aioredis

from switchboard import keys
from switchboard.demand import DemandIndex, note_demand, poke_demand


async def test_a_poke_names_its_model_and_renews_the_stream(redis: aioredis.Redis) -> None:
    pipe = redis.pipeline(transaction=False)
    poke_demand(pipe, "tiny")
    poke_demand(pipe)
    await pipe.execute()
    entries = await redis.xrange(keys.demand_stream())
    assert [fields for _, fields in entries] == [{b"m": b"tiny"}, {b"m": b""}]
    assert 0 < await redis.ttl(keys.demand_stream()) <= keys.DEMAND_TTL_S


async def note(redis: aioredis.Redis, model: str, token: str) -> None:
    pipe = redis.pipeline(transaction=False)
    note_demand(pipe, model, token)
    await pipe.execute()


async def test_a_note_indexes_the_model_under_its_token_and_pokes(redis: aioredis.Redis) -> None:
    await note(redis, "tiny", "t1")
    await note(redis, "other", "t2")
    await note(redis, "tiny", "t3")
    assert await DemandIndex(redis).read() == {"tiny": b"t3", "other": b"t2"}
    assert 0 < await redis.ttl(keys.demand_index()) <= keys.DEMAND_INDEX_TTL_S
    entries = await redis.xrange(keys.demand_stream())
    assert [fields for _, fields in entries] == [{b"m": b"tiny"}, {b"m": b"other"}, {b"m": b"tiny"}]


async def test_a_model_is_forgotten_only_under_the_token_that_was_read(redis: aioredis.Redis) -> None:
    index = DemandIndex(redis)
    await note(redis, "tiny", "t1")
    await note(redis, "other", "t2")
    read = await index.read()
    # An enqueue for tiny lands after the controller read the index (and found its stream empty):
    await note(redis, "tiny", "t3")
    assert await index.forget(list(read.items())) == 1
    assert await index.read() == {"tiny": b"t3"}, "the new job's model stays"
    assert await index.forget([("tiny", b"t3"), ("absent", b"t9")]) == 1
    assert await index.read() == {}
    assert await index.forget([]) == 0


async def test_a_model_forgotten_by_another_worker_and_noted_again_is_not_forgotten_twice(
    redis: aioredis.Redis,
) -> None:
    index = DemandIndex(redis)
    await note(redis, "tiny", "t1")
    mine = await index.read()
    theirs = await index.read()
    assert await index.forget(list(theirs.items())) == 1
    await note(redis, "tiny", "t2")  # a new job: each note's token is its own, never reused
    assert await index.forget(list(mine.items())) == 0
    assert await index.read() == {"tiny": b"t2"}
