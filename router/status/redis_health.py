"""Whether this front door can reach Redis now, so that requests fail at once while it cannot.

A connection error anywhere (a request, the result reader) marks Redis down; from then on requests
are answered 503 with Retry-After without trying Redis, and one probe task pings it every
PROBE_EVERY_S until it answers, then marks it up again: the front door recovers by itself.
"""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from router.openai.errors import RedisUnavailableError
from switchboard.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

# How often a down Redis is pinged; also the Retry-After given while it is down.
PROBE_EVERY_S = 0.25
RETRY_AFTER_S = 1.0


class RedisHealth:
    """Up or down, as last seen; down starts a probe that brings it back up."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._down_reason: str | None = None
        self._probe: asyncio.Task[None] | None = None

    @property
    def up(self) -> bool:
        """Whether Redis answered last time anyone tried."""
        return self._down_reason is None

    def require_up(self) -> None:
        """Raise the 503 for a request that needs Redis while it is known to be down."""
        if self._down_reason is not None:
            raise RedisUnavailableError(self._down_reason, RETRY_AFTER_S)

    def mark_down(self, exc: BaseException) -> None:
        """Record that Redis could not be reached; start probing it."""
        if self._down_reason is None:
            logger.warning("redis unreachable", extra={"error": str(exc)})
        self._down_reason = str(exc) or type(exc).__name__
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._wait_up(), name="redis-probe")

    def mark_up(self) -> None:
        """Record that Redis answered."""
        if self._down_reason is not None:
            logger.info("redis reachable again")
        self._down_reason = None

    async def stop(self) -> None:
        """Stop probing; idempotent."""
        await cancel_and_wait(self._probe)
        self._probe = None

    async def _wait_up(self) -> None:
        while self._down_reason is not None:
            await asyncio.sleep(PROBE_EVERY_S)
            try:
                await self._redis.ping()
            except RedisError as exc:
                self._down_reason = str(exc) or type(exc).__name__
            else:
                self.mark_up()
