"""The front door's connection to the queue: what a request handler needs, opened once per process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from router.enqueue import JobQueue
from router.openai.errors import GatewayTimeoutError, ModelNotFoundError, ServiceUnavailableError
from router.results import BLOCK_MS, ResultReader, Subscription
from switchboard import keys
from switchboard.config import ModelConfig, Settings
from switchboard.redis_conn import blocking_client, pooled_client
from switchboard.wire import Chunk, Job

logger = logging.getLogger(__name__)

# Connections for enqueues and cancel marks; the result reader has one of its own.
POOL_CONNECTIONS = 16


class Gateway:
    """Settings, Redis connections, the job queue and the result reader of one front door."""

    def __init__(self, settings: Settings, redis: aioredis.Redis, reader_redis: aioredis.Redis) -> None:
        self.settings = settings
        self.redis = redis
        self.router_id = uuid.uuid4().hex[:12]
        self.started = time.time()
        self.queue = JobQueue(redis)
        self.reader = ResultReader(reader_redis, self.router_id)
        self._reader_redis = reader_redis
        self._models = {m.name: m for m in settings.models}

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

    @contextlib.asynccontextmanager
    async def run_job(self, job: Job) -> AsyncIterator[AsyncIterator[Chunk]]:
        """Enqueue `job` and yield its chunks; cancel it if the caller leaves before the end."""
        subscription = self.reader.subscribe(job.id)
        wake = self.reader.wake_key if self.reader.blocked else None
        try:
            await self.queue.submit(job, wake_stream=wake)
        except RedisError as exc:
            self.reader.unsubscribe(subscription)
            raise ServiceUnavailableError(f"The job queue is unavailable: {exc}. Retry shortly.") from exc
        try:
            yield self._chunks_until_deadline(subscription, job)
        finally:
            self.reader.unsubscribe(subscription)
            if not subscription.finished:
                await self._cancel_quietly(job.id)

    async def _chunks_until_deadline(self, subscription: Subscription, job: Job) -> AsyncIterator[Chunk]:
        remaining = job.deadline - time.time()
        deadline = asyncio.get_running_loop().time() + remaining
        try:
            async for chunk in subscription.chunks(deadline):
                yield chunk
        except TimeoutError:
            raise GatewayTimeoutError(
                f"The job did not finish within {self.settings.router.request_timeout_s:g} s. "
                "Retry later, or raise router.request_timeout_s."
            ) from None

    async def _cancel_quietly(self, job_id: str) -> None:
        try:
            await asyncio.shield(self.queue.cancel(job_id))
        except (RedisError, asyncio.CancelledError):
            logger.warning("could not leave a cancel mark", extra={"job_id": job_id})

    async def live_workers(self) -> int:
        """How many workers sent a heartbeat recently."""
        since = time.time() - keys.WORKER_TTL_S
        return int(await self.redis.zcount(keys.workers_index(), since, "+inf"))
