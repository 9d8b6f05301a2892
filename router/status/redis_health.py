"""Whether this front door can reach Redis now, so that requests fail at once while it cannot.

A connection error anywhere (a request, the result reader) marks Redis down; from then on requests
are answered 503 with Retry-After without trying Redis, and a probe pings it every PROBE_EVERY_S
until it answers, then marks it up again: the front door recovers by itself. `unavailable` is the
one place a RedisError becomes the client's 503, whose text never carries Redis's address or
its error message (those go to the log).
"""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError, RedisError

from router.openai.errors import RedisFullError, RedisUnavailableError, ServiceUnavailableError
from switchboard.redis_conn import is_connection_error
from switchboard.tasks import TaskSet, poll

logger = logging.getLogger(__name__)

# How often a down Redis is pinged; also the Retry-After given while it is down.
PROBE_EVERY_S = 0.25
RETRY_AFTER_S = 1.0
# Retry-After for a Redis that refuses writes for want of memory.
REDIS_FULL_RETRY_S = 5.0


def is_redis_full(exc: RedisError) -> bool:
    """Whether Redis refused a write for want of memory (maxmemory with noeviction)."""
    return isinstance(exc, OutOfMemoryError)


class RedisHealth:
    """Up or down, as last seen; while down, a probe brings it back up."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._down_reason: str | None = None

    @property
    def up(self) -> bool:
        """Whether Redis answered last time anyone tried."""
        return self._down_reason is None

    def start(self, tasks: TaskSet) -> None:
        """Start the probe (idle while Redis is up) as a task of `tasks`."""
        tasks.start(poll(self._probe, PROBE_EVERY_S, "probe redis", log=logger), "redis probe")

    def require_up(self) -> None:
        """Raise the 503 for a request that needs Redis while it is known to be down."""
        if self._down_reason is not None:
            raise RedisUnavailableError(RETRY_AFTER_S)

    def mark_down(self, exc: BaseException) -> None:
        """Record that Redis could not be reached; the probe pings it from now on."""
        if self._down_reason is None:
            logger.warning("redis unreachable", extra={"error": str(exc)})
        self._down_reason = str(exc) or type(exc).__name__

    def mark_up(self) -> None:
        """Record that Redis answered."""
        if self._down_reason is not None:
            logger.info("redis reachable again")
        self._down_reason = None

    def unavailable(self, exc: RedisError) -> ServiceUnavailableError:
        """The 503 for a Redis that failed a request; a lost connection marks Redis down, so that the
        next requests are answered at once. Its text is generic: Redis's address and its own words
        are for the log (the caller logs them), not for whoever sent the request."""
        if is_redis_full(exc):
            return RedisFullError(REDIS_FULL_RETRY_S)
        if is_connection_error(exc):
            self.mark_down(exc)
            return RedisUnavailableError(RETRY_AFTER_S)
        return ServiceUnavailableError("The job queue is unavailable. Retry shortly.")

    async def _probe(self) -> None:
        if self._down_reason is None:
            return
        try:
            await self._redis.ping()
        except RedisError as exc:
            self._down_reason = str(exc) or type(exc).__name__
        else:
            self.mark_up()
