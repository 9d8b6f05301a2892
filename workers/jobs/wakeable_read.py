"""A blocking read of the job streams that a freed slot can end at once.

While a model with jobs waiting is held back (its share is taken, or its engine's batch is full),
the consumer blocks on the other models' streams, so that their jobs start the moment they arrive.
A slot that frees meanwhile would otherwise stay idle until that read times out, and the held-back
model's next job with it: a full engine batch refilled only every so often. So the read runs on a
connection of its own whose Redis client id is known, and a freed slot ends it with `CLIENT UNBLOCK`,
which makes the blocked XREADGROUP return as if it had timed out. Nothing is lost that way: a read
that is blocked has taken nothing yet, and one that has already returned is not affected (the
unblock finds no blocked client, or at worst ends the next read early, which costs one empty pass).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import redis.asyncio as aioredis

from workers.jobs import reads

logger = logging.getLogger(__name__)


class WakeableRead:
    """Blocking reads on a dedicated connection of `redis`'s pool, each of which `wake` can end."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._reader = redis.client()  # one connection, kept: its client id names it to Redis
        self._blocked_id: int | None = None
        self._waking: asyncio.Task[None] | None = None

    async def read(self, consumer: str, counts: Mapping[str, int], block_ms: int) -> reads.ReadResult:
        """`reads.read_blocking` that `wake` may end early (with nothing read)."""
        # Asked before every read, not once: a connection that the client's retries reopened has
        # another id, and an unblock sent to an old one would wake nobody.
        client_id = await self._reader.client_id()
        self._blocked_id = client_id
        try:
            return await reads.read_blocking(self._reader, consumer, counts, block_ms)
        finally:
            self._blocked_id = None

    def wake(self) -> None:
        """End the read under way, if one is; returns at once (the unblock is sent in the background)."""
        if self._blocked_id is None or (self._waking is not None and not self._waking.done()):
            return
        self._waking = asyncio.create_task(self._unblock(self._blocked_id))

    async def close(self) -> None:
        """Give the connection back to the pool."""
        if self._waking is not None:
            await asyncio.gather(self._waking, return_exceptions=True)
        await self._reader.aclose()

    async def _unblock(self, client_id: int) -> None:
        try:
            await self._redis.client_unblock(client_id)
        except Exception:
            # The read then ends at its own timeout, as it would have without the wake.
            logger.warning("could not end a blocked read of the job streams early", exc_info=True)
