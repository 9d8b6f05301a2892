"""Redis clients as both sides need them: a small shared pool, and one connection for blocking reads.

Connections outlive Redis restarts: a pooled connection idle for HEALTH_CHECK_S is pinged before it
is used, and a command that fails on a broken connection is retried a few times on a fresh one after
a short backoff, so the first request after a restart does not fail on a connection from before it.
A Redis that is down is reported within CONNECT_TIMEOUT_S, not after a long connect wait.
"""

from __future__ import annotations

from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from switchboard.metrics import count_round_trips

# What XREAD and XREADGROUP return (RESP2, bytes): [(stream, [(entry id, {field: value})])].
StreamEntries = list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]]

# Past this, a command that should have answered is treated as a dead connection.
COMMAND_TIMEOUT_S = 10.0
# A Redis that does not accept a connection within this is down (a refused connection fails at once).
CONNECT_TIMEOUT_S = 1.0
# A pooled connection idle this long is pinged before its next command.
HEALTH_CHECK_S = 5
# Retries of a command that failed on a broken connection, each on a fresh one: 50, 100, 200 ms.
RETRIES = 3
RETRY_BASE_S = 0.05
RETRY_CAP_S = 0.2


def _retry() -> Retry:
    return Retry(ExponentialBackoff(cap=RETRY_CAP_S, base=RETRY_BASE_S), RETRIES)


def pooled_client(url: str, max_connections: int = 16) -> aioredis.Redis:
    """Commands on the hot path share a bounded pool: a burst waits for a connection, it opens none."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=COMMAND_TIMEOUT_S,
        socket_timeout=COMMAND_TIMEOUT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        health_check_interval=HEALTH_CHECK_S,
        retry=_retry(),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
    )
    return count_round_trips(aioredis.Redis(connection_pool=pool), "pooled")


def blocking_client(url: str, block_ms: int) -> aioredis.Redis:
    """One dedicated connection for a loop of `XREAD BLOCK block_ms`, whose socket waits longer than that.

    It is not retried: the loop that owns it sees every failure, so that it can tell a Redis that
    restarted (and lost what it was reading) from one that only dropped a connection.
    """
    client = aioredis.Redis.from_url(
        url,
        single_connection_client=True,
        socket_timeout=block_ms / 1000 + COMMAND_TIMEOUT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        health_check_interval=HEALTH_CHECK_S,
    )
    return count_round_trips(client, "blocking")


async def server_run_id(redis: aioredis.Redis) -> str:
    """The running Redis server's run id: it changes when the server restarts."""
    info = await redis.info("server")
    return str(info["run_id"])


def is_connection_error(exc: BaseException) -> bool:
    """Whether `exc` means Redis could not be reached (as opposed to a command it refused)."""
    return isinstance(exc, RedisConnectionError | RedisTimeoutError)


def stream_entries(response: Any) -> StreamEntries:
    """Type an XREAD/XREADGROUP reply (None when the block timed out) for the code that walks it."""
    return cast(StreamEntries, response or [])
