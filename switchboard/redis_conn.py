"""Redis clients as both sides need them: a small shared pool, and one connection for blocking reads."""

from __future__ import annotations

from typing import Any, cast

import redis.asyncio as aioredis

# What XREAD and XREADGROUP return (RESP2, bytes): [(stream, [(entry id, {field: value})])].
StreamEntries = list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]]

# Past this, a command that should have answered is treated as a dead connection.
COMMAND_TIMEOUT_S = 10.0


def pooled_client(url: str, max_connections: int = 16) -> aioredis.Redis:
    """Commands on the hot path share a bounded pool: a burst waits for a connection, it opens none."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=COMMAND_TIMEOUT_S, socket_timeout=COMMAND_TIMEOUT_S
    )
    return aioredis.Redis(connection_pool=pool)


def blocking_client(url: str, block_ms: int) -> aioredis.Redis:
    """One dedicated connection for a loop of `XREAD BLOCK block_ms`, whose socket waits longer than that."""
    return aioredis.Redis.from_url(
        url, single_connection_client=True, socket_timeout=block_ms / 1000 + COMMAND_TIMEOUT_S
    )


def stream_entries(response: Any) -> StreamEntries:
    """Type an XREAD/XREADGROUP reply (None when the block timed out) for the code that walks it."""
    return cast(StreamEntries, response or [])
