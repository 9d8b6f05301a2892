"""The demand poke: one entry on the demand stream, which lives on while pokes come."""

from __future__ import annotations

import redis.asyncio as aioredis

from switchboard import keys
from switchboard.demand import poke_demand


async def test_a_poke_names_its_model_and_renews_the_stream(redis: aioredis.Redis) -> None:
    pipe = redis.pipeline(transaction=False)
    poke_demand(pipe, "tiny")
    poke_demand(pipe)
    await pipe.execute()
    entries = await redis.xrange(keys.demand_stream())
    assert [fields for _, fields in entries] == [{b"m": b"tiny"}, {b"m": b""}]
    assert 0 < await redis.ttl(keys.demand_stream()) <= keys.DEMAND_TTL_S
