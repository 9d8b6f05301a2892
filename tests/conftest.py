"""Fixtures shared by every test folder: a private redis-server per test session."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis

from switchboard.local.redis_server import PrivateRedis


@pytest.fixture(scope="session")
def redis_server() -> Iterator[PrivateRedis]:
    """A real redis-server on a free port, for the whole session."""
    with PrivateRedis() as server:
        yield server


@pytest.fixture
async def redis(redis_server: PrivateRedis) -> AsyncIterator[aioredis.Redis]:
    """A client of the session's Redis, emptied before and after each test."""
    client = aioredis.Redis.from_url(redis_server.url)
    await client.flushdb()
    yield client
    await client.flushdb()
    await client.aclose()
