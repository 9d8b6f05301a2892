"""The catalogue version: a bump moves it, and it lives as long as the facts it versions."""

from __future__ import annotations

import redis.asyncio as aioredis

from switchboard import keys
from switchboard.catalogue import bump_catalogue


async def test_every_bump_moves_the_version(redis: aioredis.Redis) -> None:
    seen = [await redis.get(keys.catalogue_version())]
    for _ in range(2):
        pipe = redis.pipeline(transaction=False)
        bump_catalogue(pipe)
        await pipe.execute()
        seen.append(await redis.get(keys.catalogue_version()))
    assert seen == [None, b"1", b"2"]
    assert 0 < await redis.ttl(keys.catalogue_version()) <= keys.CATALOGUE_VERSION_TTL_S
