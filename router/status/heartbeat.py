"""The front door's own heartbeat: a key per front door that lives while it does.

Every job carries the id of the front door that waits for it (`Job.router_id`); a worker can stop
generating for a front door whose key has expired, since nobody is left to relay the result.
"""

from __future__ import annotations

import contextlib
import logging

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard import keys
from switchboard.tasks import TaskSet, poll

logger = logging.getLogger(__name__)


class RouterHeartbeat:
    """Refreshes `keys.router_alive(router_id)` every ROUTER_HEARTBEAT_S; `forget` deletes it."""

    def __init__(self, redis: aioredis.Redis, router_id: str) -> None:
        self._redis = redis
        self._key = keys.router_alive(router_id)

    def start(self, tasks: TaskSet) -> None:
        """Beat now and every ROUTER_HEARTBEAT_S, as a task of `tasks`."""
        beating = poll(
            self._beat,
            keys.ROUTER_HEARTBEAT_S,
            "refresh the front door's heartbeat",
            first_wait=False,
            errors=(RedisError,),
            log=logger,
        )
        tasks.start(beating, "heartbeat")

    async def forget(self) -> None:
        """Remove the key at once, once beating stopped (this front door waits for nothing more)."""
        with contextlib.suppress(RedisError):
            await self._redis.delete(self._key)

    async def _beat(self) -> None:
        await self._redis.set(self._key, b"1", ex=keys.ROUTER_TTL_S)
