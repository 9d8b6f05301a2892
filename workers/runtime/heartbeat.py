"""A worker's advertisement in Redis, refreshed on a timer and removed on a clean stop."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard import keys
from switchboard.tasks import TaskSet, poll
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
        self._tasks = TaskSet("heartbeat")
        self._started = False

    async def start(self) -> None:
        """Advertise at once, then keep advertising."""
        await self.beat()
        self._tasks.start(self._run(), "beat")
        self._started = True

    async def stop(self) -> None:
        """Stop advertising and withdraw the advertisement; idempotent."""
        if not self._started:
            return
        self._started = False
        await self._tasks.stop()
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
        with contextlib.suppress(_Unhealthy):
            await poll(
                self._tick, self._interval_s, "refresh the heartbeat", errors=(RedisError,), log=logger
            )

    async def _tick(self) -> None:
        if not self._healthy():
            logger.error("the worker no longer takes jobs: its heartbeat stops")
            await self._withdraw()
            raise _Unhealthy
        await self.beat()


class _Unhealthy(Exception):
    """Ends the heartbeat's loop: the worker no longer takes jobs."""
