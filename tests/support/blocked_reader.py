"""A client blocked in Redis on streams, as a worker waits for jobs or a front door for results."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis

from tests.support.waits import eventually


async def blocked_on(redis: aioredis.Redis, streams: list[str]) -> asyncio.Task[Any]:
    """An XREAD of what is added to `streams` from now on, once Redis holds it blocked; the task's
    result is the XREAD's one reply (the streams it woke with, and their entries)."""
    before = (await redis.info("clients"))["blocked_clients"]
    read = asyncio.ensure_future(redis.xread({stream: "$" for stream in streams}, block=10_000))

    async def blocked() -> bool:
        return (await redis.info("clients"))["blocked_clients"] > before

    await eventually(blocked, what="the XREAD blocked in Redis")
    return read


def entries_woken_with(reply: Any) -> int:
    """How many entries an XREAD's reply holds, over all its streams."""
    return sum(len(entries) for _, entries in reply)
