"""A Redis client whose round trips are counted: the one thing the tests of a batching piece double."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis


class CountedRoundTrips:
    """`redis`, counting each pipeline it builds and each XREAD it sends (one round trip each)."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self.round_trips = 0
        # The keys each XREAD sent alone (not in a pipeline) read.
        self.xread_keys: list[list[str]] = []
        self._redis = redis

    def pipeline(self, **options: Any) -> Any:
        self.round_trips += 1
        return self._redis.pipeline(**options)

    async def xread(self, streams: dict[Any, Any], *args: Any, **kwargs: Any) -> Any:
        self.round_trips += 1
        self.xread_keys.append([key.decode() if isinstance(key, bytes) else key for key in streams])
        return await self._redis.xread(streams, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._redis, name)
