"""The front door's own heartbeat: a key per front door that lives while it does.

Every job carries the id of the front door that waits for it (`Job.router_id`); a worker can stop
generating for a front door whose key has expired, since nobody is left to relay the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard import keys
from switchboard.tasks import cancel_and_wait

logger = logging.getLogger(__name__)


class RouterHeartbeat:
    """Refreshes `keys.router_alive(router_id)` every ROUTER_HEARTBEAT_S; deletes it on stop."""

    def __init__(self, redis: aioredis.Redis, router_id: str) -> None:
        self._redis = redis
        self._key = keys.router_alive(router_id)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start beating."""
        self._task = asyncio.create_task(self._run(), name="router-heartbeat")

    async def stop(self) -> None:
        """Stop beating and remove the key at once (this front door waits for nothing more); idempotent."""
        if self._task is None:
            return
        await cancel_and_wait(self._task)
        self._task = None
        with contextlib.suppress(RedisError):
            await self._redis.delete(self._key)

    async def _run(self) -> None:
        while True:
            try:
                await self._redis.set(self._key, b"1", ex=keys.ROUTER_TTL_S)
            except RedisError as exc:
                logger.warning("could not refresh the front door's heartbeat", extra={"error": str(exc)})
            await asyncio.sleep(keys.ROUTER_HEARTBEAT_S)
