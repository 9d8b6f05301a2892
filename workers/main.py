"""One worker process: start Triton and the engines, take jobs, advertise, drain on SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Awaitable

from switchboard.config import DEMO_MODEL_NAME, ModelConfig, Settings, triton_model_name
from switchboard.redis_conn import pooled_client
from switchboard.wire import WorkerRecord
from workers.consumer import JobConsumer, ServedModel
from workers.cpu_placement import available_cores, compute_cores, engine_threads_bind
from workers.engines.base import Engine
from workers.engines.registry import EngineOptions, create_engine
from workers.heartbeat import Heartbeat
from workers.result_writer import ResultWriter
from workers.triton_client import TritonJobClient
from workers.triton_host import TritonHost
from workers.triton_model import CoalescingPolicy

logger = logging.getLogger(__name__)

# Longest any one step of stopping may take (draining running jobs has its own allowance on top),
# so that a stuck step never keeps the engine's processes alive.
STOP_STEP_TIMEOUT_S = 20.0


class Worker:
    """Owns the Triton host, the engines, the consumer and the heartbeat of one process."""

    def __init__(self, settings: Settings) -> None:
        if not settings.redis.url:
            raise RuntimeError("the worker needs redis.url (or REDIS_URL) to be set")
        self.settings = settings
        self.id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.started = time.time()
        # One pool for the consumer's blocking reads, the writer's pipelines and the heartbeat.
        self._redis = pooled_client(settings.redis.url)
        self._host = TritonHost(coalescing=coalescing_policy(settings))
        self._writer = ResultWriter(self._redis)
        self._heartbeat = Heartbeat(self._redis, self.record, settings.worker.heartbeat_s)
        self._models: list[ServedModel] = []
        self._consumer: JobConsumer | None = None
        self._stop_lock = asyncio.Lock()
        self._stopped = False
        self._stop_requested = asyncio.Event()

    def record(self) -> WorkerRecord:
        """How this worker advertises itself."""
        return WorkerRecord(
            id=self.id,
            host=socket.gethostname(),
            pid=os.getpid(),
            started=self.started,
            heartbeat=time.time(),
            models=tuple(m.name for m in self._models),
            triton_http_port=self._host.http_port,
            triton_grpc_port=self._host.grpc_port,
            triton_metrics_port=self._host.metrics_port,
        )

    async def run(self) -> None:
        """Start, serve until SIGTERM or SIGINT, then stop gracefully."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop_requested.set)
        try:
            await self.start()
            await self._stop_requested.wait()
        finally:
            await self.stop()

    async def start(self) -> None:
        """Start Triton, load every model, then take jobs and advertise."""
        await self._redis.ping()
        await asyncio.to_thread(self._host.start)
        models = self.settings.worker_models()
        cores = compute_cores(available_cores(), self.settings.worker.reserved_cores)
        for slot, model in enumerate(models):
            options = EngineOptions(
                cpu_threads=engine_threads_bind(cores, slot, len(models)),
                cpu_kvcache_gib=self.settings.worker.cpu_kvcache_gib,
            )
            engine = create_engine(model, options)
            self._models.append(await self._load(model, engine))
        self._writer.start()
        self._consumer = JobConsumer(
            self._redis,
            self._writer,
            worker_id=self.id,
            models=self._models,
            max_concurrent_jobs=self.settings.worker.max_concurrent_jobs,
        )
        await self._consumer.start()
        await self._heartbeat.start()
        logger.info("worker ready", extra={"worker_id": self.id, "models": [m.name for m in self._models]})

    async def _load(self, model: ModelConfig, engine: Engine) -> ServedModel:
        _ensure_demo_model(model)
        logger.info("loading model", extra={"model": model.name, "path": model.path, "engine": model.engine})
        await engine.start()
        try:
            triton_model = await asyncio.to_thread(self._host.bind, model.name, engine)
        except BaseException:
            await engine.stop()  # nothing else owns it yet
            raise
        client = TritonJobClient(self._host.grpc_address, triton_model_name(model.name))
        return ServedModel(name=model.name, client=client, triton_model=triton_model)

    async def stop(self) -> None:
        """Stop taking jobs, drain, withdraw, and release everything; idempotent."""
        async with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            logger.info("worker stopping", extra={"worker_id": self.id})
            drain_s = self.settings.worker.drain_timeout_s
            await _stop_step("withdraw the advertisement", self._heartbeat.stop())
            if self._consumer is not None:
                await _stop_step("drain running jobs", self._consumer.stop(drain_s), drain_s)
            await _stop_step("flush result chunks", self._writer.stop())
            for model in self._models:
                await _stop_step(f"close the client of {model.name}", model.client.close())
                await _stop_step(f"stop the engine of {model.name}", model.triton_model.stop_engine())
            await _stop_step("stop Triton", asyncio.to_thread(self._host.stop))
            await _stop_step("close Redis connections", self._redis.aclose())
            logger.info("worker stopped", extra={"worker_id": self.id})


async def _stop_step(name: str, step: Awaitable[object], extra_s: float = 0.0) -> None:
    """Run one step of stopping; a step that hangs or fails is logged and the next one still runs."""
    logger.info("stopping: " + name)
    try:
        async with asyncio.timeout(STOP_STEP_TIMEOUT_S + extra_s):
            await step
    except Exception:
        logger.exception("a stop step failed; going on", extra={"step": name})


def _ensure_demo_model(model: ModelConfig) -> None:
    """The demo model is built on first use; any other model must already exist."""
    if model.name == DEMO_MODEL_NAME:
        from pathlib import Path

        from switchboard.demo_model import build_demo_model

        build_demo_model(Path(model.path), progress=lambda step: logger.info(step))


def coalescing_policy(settings: Settings) -> CoalescingPolicy:
    """The worker's coalescing settings as the Triton models use them."""
    worker = settings.worker
    return CoalescingPolicy(
        min_window_s=worker.coalesce_ms / 1000,
        max_window_s=worker.coalesce_max_ms / 1000,
        max_chunks_per_s=worker.max_chunks_per_s,
    )


def run_worker(settings: Settings) -> None:
    """Entry point of `switchboard worker`."""
    asyncio.run(Worker(settings).run())
