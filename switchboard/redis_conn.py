"""Redis clients as both sides need them: a small shared pool, and one connection for blocking reads.

Connections outlive Redis restarts: a pooled connection idle for HEALTH_CHECK_S is pinged before it
is used, and a command that fails on a broken connection is retried a few times on a fresh one after
a short backoff, so the first request after a restart does not fail on a connection from before it.
A Redis that is down is reported within CONNECT_TIMEOUT_S, not after a long connect wait.

A `redis+sentinel://` URL (switchboard/redis_address.py) gives the same clients over a primary
that Sentinel watches: each new connection asks the sentinels where the primary is, so after a
failover the broken connections are retried, or the next command connects, to the new primary
(one demoted to a replica answers READONLY, which redis-py turns into a connection error). While
the sentinels elect, no primary is found: a connection error, as for a Redis that is down.
Closing a client also closes its connections to the sentinels.
"""

from __future__ import annotations

from typing import Any, cast

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
import redis.retry
import redis.sentinel
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from switchboard.metrics import count_round_trips
from switchboard.redis_address import SentinelAddress, parse_redis_url

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
# A sentinel that does not answer within this is skipped for the next one.
SENTINEL_TIMEOUT_S = 1.0


def _retry() -> Retry:
    return Retry(ExponentialBackoff(cap=RETRY_CAP_S, base=RETRY_BASE_S), RETRIES)


def pooled_client(url: str, max_connections: int = 16) -> aioredis.Redis:
    """Commands on the hot path share a bounded pool: a burst waits for a connection, it opens none."""
    options: dict[str, Any] = dict(
        max_connections=max_connections,
        timeout=COMMAND_TIMEOUT_S,
        socket_timeout=COMMAND_TIMEOUT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        health_check_interval=HEALTH_CHECK_S,
        retry=_retry(),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
    )
    sentinel = parse_redis_url(url)
    if sentinel is None:
        pool = aioredis.BlockingConnectionPool.from_url(url, **options)
        return count_round_trips(aioredis.Redis(connection_pool=pool), "pooled")
    sentinel_pool = _SentinelBlockingPool(
        sentinel.master_name, _async_sentinels(sentinel), **_async_primary_options(sentinel), **options
    )
    return count_round_trips(aioredis.Redis.from_pool(sentinel_pool), "pooled")


def blocking_client(url: str, block_ms: int) -> aioredis.Redis:
    """One dedicated connection for a loop of `XREAD BLOCK block_ms`, whose socket waits longer than that.

    It is not retried: the loop that owns it sees every failure, so that it can tell a Redis that
    restarted (and lost what it was reading) from one that only dropped a connection.
    """
    options: dict[str, Any] = dict(
        socket_timeout=block_ms / 1000 + COMMAND_TIMEOUT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        health_check_interval=HEALTH_CHECK_S,
    )
    sentinel = parse_redis_url(url)
    if sentinel is None:
        client = aioredis.Redis.from_url(url, single_connection_client=True, **options)
        return count_round_trips(client, "blocking")
    pool = _SentinelPool(
        sentinel.master_name, _async_sentinels(sentinel), **_async_primary_options(sentinel), **options
    )
    client = aioredis.Redis(connection_pool=pool, single_connection_client=True)
    # The client owns its pool (as from_url's does), so closing it closes the pool and the sentinels.
    client.auto_close_connection_pool = True
    return count_round_trips(client, "blocking")


def sync_client(url: str, timeout_s: float) -> redis.Redis:
    """A client for one-off commands from a synchronous caller (the CLI, a check at start)."""
    options: dict[str, Any] = dict(socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    sentinel = parse_redis_url(url)
    if sentinel is None:
        return redis.Redis.from_url(url, **options)
    sentinels = redis.sentinel.Sentinel(
        sentinel.sentinels, sentinel_kwargs=_sentinel_options(sentinel, retry=redis.retry.Retry)
    )
    pool = _SyncSentinelPool(sentinel.master_name, sentinels, **sentinel.primary_options(), **options)
    return redis.Redis.from_pool(pool)


class _FollowingConnection(aiosentinel.SentinelManagedConnection):
    """A connection to the primary that asks the sentinels where it is before every reconnect.

    redis-py's own asks only when the pool hands it out: a command retried after its connection
    broke (a killed primary) reconnects to the address it had, the old primary's, every retry
    (redis/redis-py#3874, open in 8.1).
    """

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self.is_connected:
            await self.connect()
        await super().send_packed_command(command, check_health)


class _FollowingSSLConnection(_FollowingConnection, aiosentinel.SentinelManagedSSLConnection):
    pass


class _ClosesItsSentinels:
    """A Sentinel pool that also closes its sentinels' connections when it is closed.

    Not when it is disconnected: the pool disconnects itself at every change of primary.
    """

    sentinel_manager: aiosentinel.Sentinel

    async def aclose(self) -> None:
        try:
            await super().aclose()  # type: ignore[misc]
        finally:
            await self.sentinel_manager.aclose()


class _SentinelPool(_ClosesItsSentinels, aiosentinel.SentinelConnectionPool):
    """Connections to the primary, opened as needed (the blocking client holds one)."""


class _SentinelBlockingPool(
    _ClosesItsSentinels, aiosentinel.SentinelConnectionPool, aioredis.BlockingConnectionPool
):
    """At most `max_connections` connections to the primary; past them, a command waits for one.

    (The pool redis-py's `Sentinel.master_for` makes raises "Too many connections" instead.)
    """


class _SyncSentinelPool(redis.sentinel.SentinelConnectionPool):
    sentinel_manager: redis.sentinel.Sentinel

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.sentinel_manager.close()


def _async_primary_options(address: SentinelAddress) -> dict[str, Any]:
    options = address.primary_options()
    options["connection_class"] = (
        _FollowingSSLConnection if options.pop("ssl", False) else _FollowingConnection
    )
    return options


def _async_sentinels(address: SentinelAddress) -> aiosentinel.Sentinel:
    return aiosentinel.Sentinel(address.sentinels, sentinel_kwargs=_sentinel_options(address, retry=Retry))


def _sentinel_options(address: SentinelAddress, retry: Any) -> dict[str, Any]:
    # No retries on a sentinel: one that fails is skipped for the next, which is quicker.
    return dict(
        address.sentinel_options(),
        socket_timeout=SENTINEL_TIMEOUT_S,
        socket_connect_timeout=SENTINEL_TIMEOUT_S,
        retry=retry(NoBackoff(), 0),
    )


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
