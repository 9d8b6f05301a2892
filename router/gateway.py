"""The front door's connection to the queue: what a request handler needs, opened once per process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from router.admission import REDIS_FULL_RETRY_S, Admission, Ticket, is_redis_full
from router.auth import Caller, KeyTable, check_exposure
from router.enqueue import JobQueue
from router.job_run import JobRun
from router.model_limits import ModelLimitsCache
from router.model_status import ModelStatusReader
from router.openai.errors import (
    ModelLoadFailedError,
    ModelNotFoundError,
    RedisFullError,
    ServiceUnavailableError,
)
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
        self.key_table = KeyTable(redis, settings)
        self.admission = Admission(redis, settings.limits)

    @classmethod
    async def open(cls, settings: Settings) -> Gateway:
        """Connect to Redis, read the API keys and start the result reader.

        Raises ConfigError for a front door that would serve other machines without any key.
        """
        if not settings.redis.url:
            raise RuntimeError("the front door needs redis.url (or REDIS_URL) to be set")
        keys.set_prefix(settings.redis.key_prefix)
        redis = pooled_client(settings.redis.url, POOL_CONNECTIONS)
        # The reader blocks in XREAD, so it gets a connection of its own.
        reader_redis = blocking_client(settings.redis.url, BLOCK_MS)
        gateway = cls(settings, redis, reader_redis)
        try:
            await gateway.key_table.load()
        except RedisError as exc:
            # Redis may come up after the front door: until it does every request is a 503, and
            # a front door beyond loopback asks for a key whatever Redis holds (router.auth).
            logger.warning("could not read the API keys at start", extra={"error": str(exc)})
        else:
            try:
                check_exposure(settings, gateway.key_table.stored_count)
            except BaseException:
                await reader_redis.aclose()
                await redis.aclose()
                raise
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

    async def start_job(self, job: Job, caller: Caller) -> JobRun:
        """Admit `job` for `caller`, enqueue it and start reading its results; the caller must
        `close()` what it gets.

        A model the caller's key may not use is a 403; a limit met at admission, a 429. A model
        whose last load failed takes no job: its failure is a 503 with Retry-After at once.
        """
        caller.require_model(job.model)
        job = msgspec.structs.replace(job, tenant=caller.name)
        ticket = await self._admit(job, caller)
        subscription = self.reader.subscribe(job.id)
        wake = self.reader.wake_key if self.reader.blocked else None
        try:
            failure = await self.queue.submit(job, wake_stream=wake)
            if failure is not None:
                raise ModelLoadFailedError(job.model, failure.reason, failure.retry_at - time.time())
        except BaseException as exc:
            self.reader.unsubscribe(subscription)
            # Shielded: a client that left cancels this task, and the slots must still be given back
            # (and a job that may have been queued for nobody, cancelled).
            left = isinstance(exc, asyncio.CancelledError)
            await asyncio.shield(self._abandon(job.id, ticket, cancel=left))
            if isinstance(exc, RedisError):
                raise _unavailable(exc) from exc
            raise
        return JobRun(
            job,
            subscription,
            reader=self.reader,
            queue=self.queue,
            status=self.status,
            timeout_s=self.settings.router.request_timeout_s,
            ticket=ticket,
        )

    async def _admit(self, job: Job, caller: Caller) -> Ticket:
        admitting = asyncio.ensure_future(self.admission.admit(job, caller))
        try:
            return await asyncio.shield(admitting)
        except asyncio.CancelledError:
            # The client left while its admission was in flight: give back what it may have taken.
            with contextlib.suppress(Exception):
                await self._abandon(job.id, await admitting, cancel=False)
            raise
        except RedisError as exc:
            raise _unavailable(exc) from exc

    async def _abandon(self, job_id: str, ticket: Ticket, *, cancel: bool) -> None:
        """Give back the ticket of a job that nobody waits for (nothing was generated for it)."""
        try:
            if cancel:
                await self.queue.cancel(job_id)
            await ticket.release(0)
        except RedisError:
            logger.warning("could not release the job's admission slots", extra={"job_id": job_id})

    @contextlib.asynccontextmanager
    async def run_job(self, job: Job, caller: Caller) -> AsyncIterator[JobRun]:
        """`start_job` for a caller that is done with the job when its block ends."""
        run = await self.start_job(job, caller)
        try:
            yield run
        finally:
            await run.close()

    async def live_workers(self) -> int:
        """How many workers sent a heartbeat recently."""
        since = time.time() - keys.WORKER_TTL_S
        return int(await self.redis.zcount(keys.workers_index(), since, "+inf"))


def _unavailable(exc: RedisError) -> ServiceUnavailableError:
    """The 503 for a Redis that failed while a job was being queued."""
    if is_redis_full(exc):
        return RedisFullError(REDIS_FULL_RETRY_S)
    return ServiceUnavailableError(f"The job queue is unavailable: {exc}. Retry shortly.")
