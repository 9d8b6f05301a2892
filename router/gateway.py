"""The front door's connection to the queue: what a request handler needs, opened once per process."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from router.enqueue import JobQueue
from router.job_run import JobRun
from router.model_limits import ModelLimitsCache
from router.model_status import ModelStatusReader
from router.openai.errors import ModelLoadFailedError, ModelNotFoundError, ServiceUnavailableError
from router.results import BLOCK_MS, ResultReader
from switchboard import keys
from switchboard.config import ModelConfig, Settings
from switchboard.redis_conn import blocking_client, pooled_client
from switchboard.wire import Job

logger = logging.getLogger(__name__)

# Connections for enqueues and cancel marks; the result reader has one of its own.
POOL_CONNECTIONS = 16


class Gateway:
    """Settings, Redis connections, the job queue, the result reader and model status of one front door."""

    def __init__(self, settings: Settings, redis: aioredis.Redis, reader_redis: aioredis.Redis) -> None:
        self.settings = settings
        self.redis = redis
        self.router_id = uuid.uuid4().hex[:12]
        self.started = time.time()
        self.queue = JobQueue(redis)
        self.reader = ResultReader(reader_redis, self.router_id)
        self._reader_redis = reader_redis
        self._models = {m.name: m for m in settings.models}
        self.status = ModelStatusReader(redis, settings.models)
        self.limits = ModelLimitsCache(redis)

    @classmethod
    async def open(cls, settings: Settings) -> Gateway:
        """Connect to Redis and start the result reader."""
        if not settings.redis.url:
            raise RuntimeError("the front door needs redis.url (or REDIS_URL) to be set")
        redis = pooled_client(settings.redis.url, POOL_CONNECTIONS)
        # The reader blocks in XREAD, so it gets a connection of its own.
        reader_redis = blocking_client(settings.redis.url, BLOCK_MS)
        gateway = cls(settings, redis, reader_redis)
        gateway.reader.start()
        return gateway

    async def close(self) -> None:
        """Stop the reader and close the connections."""
        await self.reader.stop()
        await self._reader_redis.aclose()
        await self.redis.aclose()

    def model_names(self) -> list[str]:
        """Every model this front door routes."""
        return list(self._models)

    def require_model(self, name: str) -> ModelConfig:
        """The model's configuration, or a 404 in OpenAI's shape."""
        model = self._models.get(name)
        if model is None:
            raise ModelNotFoundError(name, self.model_names())
        return model

    async def start_job(self, job: Job) -> JobRun:
        """Enqueue `job` and start reading its results; the caller must `close()` what it gets.

        A model whose last load failed takes no job: its failure is a 503 with Retry-After at once.
        """
        subscription = self.reader.subscribe(job.id)
        wake = self.reader.wake_key if self.reader.blocked else None
        try:
            failure = await self.queue.submit(job, wake_stream=wake)
        except RedisError as exc:
            self.reader.unsubscribe(subscription)
            raise ServiceUnavailableError(f"The job queue is unavailable: {exc}. Retry shortly.") from exc
        if failure is not None:
            self.reader.unsubscribe(subscription)
            raise ModelLoadFailedError(job.model, failure.reason, failure.retry_at - time.time())
        return JobRun(
            job,
            subscription,
            reader=self.reader,
            queue=self.queue,
            status=self.status,
            timeout_s=self.settings.router.request_timeout_s,
        )

    @contextlib.asynccontextmanager
    async def run_job(self, job: Job) -> AsyncIterator[JobRun]:
        """`start_job` for a caller that is done with the job when its block ends."""
        run = await self.start_job(job)
        try:
            yield run
        finally:
            await run.close()

    async def live_workers(self) -> int:
        """How many workers sent a heartbeat recently."""
        since = time.time() - keys.WORKER_TTL_S
        return int(await self.redis.zcount(keys.workers_index(), since, "+inf"))
