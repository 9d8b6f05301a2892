"""A worker's advertisement in Redis, refreshed on a timer and removed on a clean stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard import keys
from switchboard.tasks import cancel_and_wait
from switchboard.wire import WorkerRecord, encode

logger = logging.getLogger(__name__)


class Heartbeat:
    """Keeps `sb:worker:{id}` and the workers index fresh while the worker runs.

    It beats only while `healthy()` says so (the loop that takes jobs is running): a worker that
    no longer takes jobs withdraws its record, so that it stops counting as alive (the front
    door's readiness, the controllers' view) and its pending jobs are taken over.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        record: Callable[[], WorkerRecord],
        interval_s: float,
        healthy: Callable[[], bool] = lambda: True,
    ) -> None:
        self._redis = redis
        self._record = record
        self._interval_s = interval_s
        self._healthy = healthy
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Advertise at once, then keep advertising."""
        await self.beat()
        self._task = asyncio.create_task(self._run(), name="heartbeat")

    async def stop(self) -> None:
        """Stop advertising and withdraw the advertisement; idempotent."""
        if self._task is None:
            return
        await cancel_and_wait(self._task)
        self._task = None
        await self._withdraw()

    async def _withdraw(self) -> None:
        worker_id = self._record().id
        with contextlib.suppress(RedisError):
            pipe = self._redis.pipeline(transaction=False)
            pipe.delete(keys.worker_record(worker_id))
            pipe.zrem(keys.workers_index(), worker_id)
            await pipe.execute()

    async def beat(self) -> None:
        """Refresh the record and its score; drop workers that stopped beating long ago.

        While the worker is not healthy, withdraw the record instead.
        """
        if not self._healthy():
            await self._withdraw()
            return
        record = self._record()
        now = time.time()
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(keys.worker_record(record.id), encode(record), ex=keys.WORKER_TTL_S)
        pipe.zadd(keys.workers_index(), {record.id: now})
        pipe.zremrangebyscore(keys.workers_index(), "-inf", now - 4 * keys.WORKER_TTL_S)
        # The index itself goes away with the last worker.
        pipe.expire(keys.workers_index(), 4 * keys.WORKER_TTL_S)
        await pipe.execute()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            if not self._healthy():
                logger.error("the worker no longer takes jobs: its heartbeat stops")
                await self._withdraw()
                return
            try:
                await self.beat()
            except RedisError:
                logger.warning("heartbeat failed; retrying", exc_info=True)
