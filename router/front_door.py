"""The long-lived parts of one front door: opened as the app starts, closed as it stops.

Redis clients (a pooled one, and one for the result reader's blocking reads), the key table, the
model table and status, the routes and pipelines, the limits cache, admission, the job queue and its runs, and the
background tasks (result reader, heartbeat, Redis probe, delayed cancel marks) in one `TaskSet`
that closing stops. `router.app` hands each part to the handlers that ask for it.
"""

from __future__ import annotations

import logging
import time
import uuid

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from router.admission.auth import KeyTable, check_exposure
from router.admission.fits import ModelLimitsCache
from router.admission.limits import Admission
from router.admission.model_table import ModelTable
from router.batches.lines import LineRunner
from router.batches.records import BatchRecords
from router.batches.runner import BatchRunner
from router.files.records import FileRecords
from router.files.service import FileService
from router.flow import RequestFlow
from router.http.body_budget import BodyBudget
from router.pooling_flow import PoolingFlow
from router.queue.enqueue import JobQueue
from router.queue.results import BLOCK_MS, ResultReader
from router.queue.starts import JobRuns
from router.relay.answer import Relaying
from router.routing.pipelines.pipeline_table import PipelineTable
from router.routing.pipelines.step_parts import StepParts
from router.routing.rollouts.judge import RolloutJudge
from router.routing.rollouts.shadow import ShadowTraffic
from router.routing.routes.route_table import RouteTable
from router.status.heartbeat import RouterHeartbeat
from router.status.model_status import ModelStatusReader
from router.status.redis_health import RedisHealth
from router.telemetry.rollout_observations import Observations
from switchboard.adapter_registry import AdapterRegistry
from switchboard.config import ModelKind, Settings
from switchboard.redis_conn import blocking_client, pooled_client
from switchboard.tasks import TaskSet

logger = logging.getLogger(__name__)

# Connections for enqueues and cancel marks; the result reader has one of its own.
POOL_CONNECTIONS = 16
# How long a stopping front door waits for the releases its last answers sent without waiting, and
# then for the deletion of their results.
RELEASE_DRAIN_S = 2.0


class FrontDoor:
    """The parts of one front door; `open` connects and starts its tasks, `close` stops them all."""

    def __init__(self, settings: Settings, redis: aioredis.Redis, reader_redis: aioredis.Redis) -> None:
        router_id = uuid.uuid4().hex[:12]
        self.settings = settings
        self.redis = redis
        self._reader_redis = reader_redis
        self.tasks = TaskSet("front door")
        # The config's pipelines, and those the admin API sets (read from Redis by a background task).
        self.pipelines = PipelineTable(
            redis, settings.pipelines, models=[m.name for m in settings.models], routes=settings.routes
        )
        # The LoRA adapters registered at run time (read from Redis by a background task).
        self.adapters = AdapterRegistry(redis, settings.models)
        self.models = ModelTable(
            settings.models,
            started=time.time(),
            routes=list(settings.routes),
            pipelines=self.pipelines.names,
            registry=self.adapters,
        )
        self.health = RedisHealth(redis)
        self.heartbeat = RouterHeartbeat(redis, router_id)
        self.reader = ResultReader(reader_redis, router_id, self.health)
        self.status = ModelStatusReader(redis, settings.models, self.adapters)
        self.limits = ModelLimitsCache(redis)
        self.key_table = KeyTable(redis, settings)
        self.admission = Admission(redis, settings.limits)
        # Bytes of the request bodies being read, per key and in all (`read_body`).
        self.body_budget = BodyBudget.of(settings.router)
        queue = JobQueue(redis, self.tasks)
        # What this front door saw of running rollouts, counted in memory and flushed by the judge.
        observations = Observations()
        self.runs = JobRuns(
            queue, self.reader, self.status, settings.router, router_id, self.admission, observations
        )
        self.routes = RouteTable(redis, settings.routes)
        self.judge = RolloutJudge(redis, self.routes, self.status, router_id, observations)
        # Copies of routed requests for their routes' shadow versions, run among the front door's tasks.
        self.shadow = ShadowTraffic(
            settings.routes,
            redis=redis,
            queue=queue,
            reader=self.reader,
            status=self.status,
            tasks=self.tasks,
            settings=settings.router,
        )
        parts = StepParts(
            routes=self.routes,
            pipelines=self.pipelines,
            runs=self.runs,
            relaying=Relaying(settings.router, self.status),
            status=self.status,
            health=self.health,
            timeout_s=settings.router.request_timeout_s,
        )
        self.flow = RequestFlow(
            settings, models=self.models, limits=self.limits, parts=parts, shadow=self.shadow
        )
        self.pooling = PoolingFlow(
            self.runs,
            models=self.models,
            routes=self.routes,
            pipelines=self.pipelines,
            limits=self.limits,
            health=self.health,
            settings=settings.router,
        )
        self.files = FileService(settings, FileRecords(redis), self.served_kind)
        self.batches = BatchRecords(redis)
        lines = LineRunner(
            models=self.models,
            limits=self.limits,
            runs=self.runs,
            pooling=self.pooling,
            settings=settings.router,
        )
        self.batch_runner = BatchRunner(
            redis, self.batches, self.files, lines, self.key_table.by_owner, router_id, settings.batches
        )

    def served_kind(self, name: str) -> ModelKind | None:
        """What a request naming `name` gets here: its model's kind, text generation for a route or a
        pipeline, None for a name served as nothing."""
        model = self.models.get(name)
        if model is not None:
            return model.kind
        if self.routes.get(name) is not None or self.pipelines.get(name) is not None:
            return "generate"
        return None

    @classmethod
    async def open(cls, settings: Settings) -> FrontDoor:
        """Connect to Redis, read the API keys and start the background tasks.

        Raises ConfigError for a front door that would serve other machines without any key.
        """
        if not settings.redis.url:
            raise RuntimeError("the front door needs redis.url (or REDIS_URL) to be set")
        redis = pooled_client(settings.redis.url, POOL_CONNECTIONS)
        # The reader blocks in XREAD, so it gets a connection of its own.
        reader_redis = blocking_client(settings.redis.url, BLOCK_MS)
        front_door = cls(settings, redis, reader_redis)
        try:
            await front_door.key_table.load()
        except RedisError as exc:
            # Redis may come up after the front door: until it does every request is a 503, and
            # a front door beyond loopback asks for a key whatever Redis holds (router.admission.auth).
            logger.warning("could not read the API keys at start", extra={"error": str(exc)})
        else:
            try:
                check_exposure(settings, front_door.key_table.stored_count)
            except BaseException:
                await reader_redis.aclose()
                await redis.aclose()
                raise
        front_door.reader.start(front_door.tasks)
        front_door.routes.start(front_door.tasks)
        front_door.pipelines.start(front_door.tasks)
        front_door.adapters.start(front_door.tasks)
        front_door.judge.start(front_door.tasks)
        front_door.heartbeat.start(front_door.tasks)
        front_door.health.start(front_door.tasks)
        front_door.files.start(front_door.tasks)
        front_door.batch_runner.start(front_door.tasks)
        return front_door

    async def close(self) -> None:
        """Stop every background task, remove the heartbeat and close the connections."""
        await self.tasks.stop()
        await self.batch_runner.stop()
        self.files.close()
        await self.judge.stop()
        await self.admission.drain(RELEASE_DRAIN_S)
        await self.reader.flush_ended(RELEASE_DRAIN_S)
        await self.heartbeat.forget()
        await self._reader_redis.aclose()
        await self.redis.aclose()
