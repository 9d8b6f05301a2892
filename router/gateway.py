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

from router.admission.auth import Caller, KeyTable, check_exposure
from router.admission.fits import ModelLimitsCache
from router.admission.limits import REDIS_FULL_RETRY_S, Admission, Ticket, is_redis_full
from router.openai.errors import (
    ModelLoadFailedError,
    ModelNotFoundError,
    NoWorkerForModelError,
    RedisFullError,
    RedisUnavailableError,
    ServiceUnavailableError,
    StreamNotFoundError,
)
from router.queue.enqueue import JobQueue
from router.queue.results import BLOCK_MS, ResultReader, Subscription
from router.queue.run import JobRun
from router.status.heartbeat import RouterHeartbeat
from router.status.models import ModelStatusReader, may_serve
from router.status.redis_health import RETRY_AFTER_S, RedisHealth
from router.telemetry.job_observer import JobObserver
from router.telemetry.requests import note_model
from switchboard import keys
from switchboard.config import ModelConfig, Settings
from switchboard.redis_conn import blocking_client, is_connection_error, pooled_client
from switchboard.wire import Chunk, Job

logger = logging.getLogger(__name__)

# Connections for enqueues and cancel marks; the result reader has one of its own.
POOL_CONNECTIONS = 16
# Requests share one read of the live workers' records this recent (no round trip per request).
WORKERS_MAX_AGE_S = 1.0
# Retry-After for a model that no live worker may hold: about when a new worker's heartbeat shows.
NO_WORKER_RETRY_S = 5.0


class Gateway:
    """Settings, Redis connections, the job queue, the result reader and model status of one front door."""

    def __init__(self, settings: Settings, redis: aioredis.Redis, reader_redis: aioredis.Redis) -> None:
        self.settings = settings
        self.redis = redis
        self.router_id = uuid.uuid4().hex[:12]
        self.started = time.time()
        self.queue = JobQueue(redis)
        self.health = RedisHealth(redis)
        self.heartbeat = RouterHeartbeat(redis, self.router_id)
        self.reader = ResultReader(reader_redis, self.router_id, self.health)
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
            # a front door beyond loopback asks for a key whatever Redis holds (router.admission.auth).
            logger.warning("could not read the API keys at start", extra={"error": str(exc)})
        else:
            try:
                check_exposure(settings, gateway.key_table.stored_count)
            except BaseException:
                await reader_redis.aclose()
                await redis.aclose()
                raise
        gateway.reader.start()
        gateway.heartbeat.start()
        return gateway

    async def close(self) -> None:
        """Stop the reader and close the connections."""
        await self.heartbeat.stop()
        await self.reader.stop()
        await self.health.stop()
        await self.queue.stop()
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
        note_model(name)
        return model

    async def start_job(self, job: Job, caller: Caller) -> JobRun:
        """Admit `job` for `caller`, enqueue it and start reading its results; the caller must
        `close()` what it gets.

        A model the caller's key may not use is a 403; a limit met at admission, a 429. A model
        whose last load failed takes no job: its failure is a 503 with Retry-After at once; so is a
        model that no live worker may hold, and every job while Redis cannot be reached.
        """
        caller.require_model(job.model)
        job = msgspec.structs.replace(job, tenant=caller.name, router_id=self.router_id)
        self.health.require_up()
        await self._require_worker_for(job.model)
        observer = JobObserver(job)
        with observer.phase("switchboard.admission"):
            ticket = await self._admit(job, caller)
        subscription = self.reader.subscribe(job.id, job.model)
        wake = self.reader.wake_key if self.reader.blocked else None
        try:
            with observer.phase("switchboard.enqueue"):
                failure = await self.queue.submit(observer.traced(job), wake_stream=wake)
            if failure is not None:
                raise ModelLoadFailedError(job.model, failure.reason, failure.retry_at - time.time())
        except BaseException as exc:
            observer.closed(finished=False)
            self.reader.unsubscribe(subscription)
            # Shielded: a client that left cancels this task, and the slots must still be given back
            # (and a job that may have been queued for nobody, cancelled).
            left = isinstance(exc, asyncio.CancelledError)
            await asyncio.shield(self._abandon(job.id, ticket, cancel=left))
            if isinstance(exc, RedisError):
                raise self.unavailable(exc) from exc
            raise
        return self._run(job, subscription, ticket, observer=observer)

    async def resume_job(self, job: Job, caller: Caller, after: str) -> tuple[JobRun, list[Chunk]]:
        """The rest of `job`'s results, from after entry `after` (a stream resumed with
        `Last-Event-ID`), and the chunks up to it, which the client had; a 404 if its result stream
        is gone, or the job was sent with another key. No new job is queued."""
        caller.require_model(job.model)
        self.health.require_up()
        try:
            found = await self.queue.resume(job.id, after)
        except RedisError as exc:
            raise self.unavailable(exc) from exc
        if found is None or found.tenant != (caller.name or ""):
            # Another key's job reads as an unknown one: its existence is not revealed.
            raise StreamNotFoundError(
                f"No results of job {job.id} are kept for this key: it is unknown, its results "
                f"expired ({keys.RESULT_TTL_S} s after their last chunk, {keys.FINISHED_RESULT_TTL_S} s "
                "after a stream was read to its end), or it was sent with another API key. Send the "
                "request again without Last-Event-ID."
            )
        subscription = self.reader.subscribe(job.id, job.model, after, streamed=True)
        if self.reader.blocked:
            # Without the poke, the reader's next pass (within BLOCK_MS) picks the subscription up.
            with contextlib.suppress(RedisError):
                await self.reader.wake()
        observer = JobObserver(job, resumed=True)
        return self._run(job, subscription, None, observer=observer), found.earlier

    def _run(
        self, job: Job, subscription: Subscription, ticket: Ticket | None, observer: JobObserver | None = None
    ) -> JobRun:
        return JobRun(
            job,
            subscription,
            reader=self.reader,
            queue=self.queue,
            status=self.status,
            timeout_s=self.settings.router.request_timeout_s,
            ticket=ticket,
            resume_grace_s=self.settings.router.resume_grace_s,
            observer=observer,
        )

    async def _require_worker_for(self, model: str) -> None:
        """A 503 at once for a model that no live worker may hold (while any worker is alive: with
        none, the job waits in the queue for the first one to start)."""
        try:
            records = await self.status.live_workers(WORKERS_MAX_AGE_S)
        except RedisError as exc:
            raise self.unavailable(exc) from exc
        if records and not may_serve(records, model):
            raise NoWorkerForModelError(model, NO_WORKER_RETRY_S)

    def unavailable(self, exc: RedisError) -> ServiceUnavailableError:
        """The 503 for a Redis that failed while a job was being queued; a lost connection marks
        Redis down, so that the next requests are answered at once."""
        if is_redis_full(exc):
            return RedisFullError(REDIS_FULL_RETRY_S)
        if is_connection_error(exc):
            self.health.mark_down(exc)
            return RedisUnavailableError(str(exc), RETRY_AFTER_S)
        return ServiceUnavailableError(f"The job queue is unavailable: {exc}. Retry shortly.")

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
            raise self.unavailable(exc) from exc

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
