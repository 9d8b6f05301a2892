"""The model controller of one worker, put together from the worker's parts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from switchboard.config import ModelConfig, WorkerConfig
from workers.controller.coordination import Coordination
from workers.controller.effects import WorkerEffects
from workers.controller.loop import Backoff, ModelController
from workers.controller.snapshot import SnapshotReader
from workers.controller.view import WorkerLimits
from workers.jobs.consume import JobConsumer
from workers.models.files import ModelFiles
from workers.models.slots import Slots


def model_controller(
    settings: WorkerConfig,
    *,
    models: list[ModelConfig],
    worker_id: str,
    kind: str,
    memory_budget_bytes: int,
    expected_footprint: Callable[[ModelConfig, list[bytes]], int],
    redis: aioredis.Redis,
    poke_redis: aioredis.Redis,
    slots: Slots,
    consumer: JobConsumer,
    coordination: Coordination,
    advertise: Callable[[], Awaitable[None]],
    files: ModelFiles | None = None,
) -> ModelController:
    """The controller that loads and unloads `models` on this worker within its limits, reading
    and acting through the worker's Redis clients, slots, consumer and coordination."""
    snapshot = SnapshotReader(
        redis,
        models,
        slots,
        kind=kind,
        memory_budget_bytes=memory_budget_bytes,
        expected_footprint=expected_footprint,
        files=files,
    )
    limits = WorkerLimits(
        max_loaded_models=settings.max_loaded_models,
        memory_budget_bytes=memory_budget_bytes,
        min_residency_s=settings.min_residency_s,
        max_pass_over_s=settings.max_pass_over_s,
    )
    effects = WorkerEffects(
        redis=redis,
        poke_redis=poke_redis,
        slots=slots,
        consumer=consumer,
        coordination=coordination,
        snapshot=snapshot,
        worker_id=worker_id,
        advertise=advertise,
        files=files,
    )
    return ModelController(
        effects=effects,
        models=models,
        worker_id=worker_id,
        limits=limits,
        backoff=Backoff(settings.load_backoff_s, settings.load_backoff_max_s),
        tick_s=settings.controller_tick_s,
    )
