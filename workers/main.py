"""One worker process: advertise at once, start Triton, load models on demand, drain on SIGTERM.

No model is loaded at start (unless one says `preload = true`): the model controller loads what
requests ask for, keeps it while it is used, and unloads it when idle. Triton starts and vLLM is
imported in the background right after the worker advertises itself, so the first load pays for
neither; the record says when both are done (`engines_ready`), as `switchboard up` and the front
door's `/readyz` wait for that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from redis.exceptions import RedisError

from switchboard import gc_heap
from switchboard.adapter_registry import AdapterRegistry
from switchboard.config import ModelConfig, Settings
from switchboard.redis_conn import blocking_client, pooled_client
from switchboard.tasks import TaskSet
from switchboard.tracing import configure_tracing
from switchboard.wire import WorkerRecord
from workers.controller.assembly import model_controller
from workers.controller.coordination import Coordination
from workers.engines.base import Engine
from workers.engines.registry import (
    EngineOptions,
    NoRunnableModel,
    create_engine,
    import_runtimes,
    prepare_model_files,
    runnable_models,
)
from workers.jobs.consume import JobConsumer
from workers.jobs.writer import ResultWriter
from workers.models.files import ModelFiles
from workers.models.slot import ModelSlot
from workers.models.slots import Slots
from workers.runtime import descendants_guard
from workers.runtime.cpu_priority import EnginePriorities
from workers.runtime.heap_upkeep import HeapUpkeep
from workers.runtime.heartbeat import Heartbeat
from workers.runtime.machine import machine_kind, memory_budget_bytes
from workers.runtime.metrics_server import MetricsServer
from workers.runtime.placement import Placement
from workers.runtime.private_runtime import private_process_files
from workers.runtime.worker_metrics import SLOTS
from workers.triton.generator.model import CoalescingPolicy
from workers.triton.host import TritonHost

logger = logging.getLogger(__name__)

# Longest any one step of stopping may take (draining running jobs has its own allowance on top),
# so that a stuck step never keeps the engine's processes alive.
STOP_STEP_TIMEOUT_S = 20.0
# How long a thread holding the GIL may run while another waits for it (see run_worker).
GIL_SWITCH_INTERVAL_S = 0.0005

EngineFactory = Callable[[ModelConfig, EngineOptions], Engine]


class CannotStart(RuntimeError):
    """The settings give this worker nothing it could do; the message says what to change."""


class Worker:
    """Owns the Triton host, the model slots, the consumer, the controller and the heartbeat."""

    def __init__(
        self,
        settings: Settings,
        engine_factory: EngineFactory = create_engine,
        *,
        owns_process: bool = False,
    ) -> None:
        """`engine_factory` makes an engine for a model; tests of the worker's own parts pass a scripted one.
        `owns_process`: the worker is the whole process (`switchboard worker`), and may place it."""
        if not settings.redis.url:
            raise CannotStart("the worker needs redis.url (or REDIS_URL) to be set")
        self.settings = settings
        self._owns_process = owns_process
        self.id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.started = time.time()
        self.kind = settings.worker.kind or machine_kind()
        self.memory_budget = memory_budget_bytes(self.kind, settings.worker.memory_budget_gib)
        self._models = self._models_it_can_run(settings.worker_models(), engine_factory)
        self._engine_factory = engine_factory
        self._stop_requested = asyncio.Event()
        # One pool for the consumer's blocking reads, the writer's pipelines and the heartbeat.
        self._redis = pooled_client(settings.redis.url)
        self._poke_redis = blocking_client(settings.redis.url, int(settings.worker.controller_tick_s * 1000))
        # Before Triton and the engine runtime start: they inherit where this process runs.
        self._placement = Placement(settings.worker, place_process=owns_process and self.kind == "cpu")
        self._host = TritonHost(coalescing=CoalescingPolicy.of(settings.worker))
        self._host_started = asyncio.Event()
        self._engines_imported = asyncio.Event()
        # Advertised: Triton runs and the engines' runtime is imported (see `_advertise_when_prepared`).
        self._engines_ready = False
        self._writer = ResultWriter(self._redis, self.id)
        self._coordination = Coordination(self._redis, self.id, self.kind)
        # Where the models' files are: remote models' fetched into this host's node cache.
        self._files = ModelFiles(settings.worker, self._models)
        self._slots = Slots(
            self._models,
            host=self._host,
            host_started=self._host_started,
            create_engine=self._create_engine,
            files=self._files,
        )
        # While several models run jobs here, the engines of one past its share yield the cores.
        self._priorities = EnginePriorities.for_worker(
            self._slots.model_loads,
            self._slots.engine_processes,
            background_nice=settings.worker.background_nice,
            total_slots=settings.worker.max_concurrent_jobs,
            enabled=settings.worker.fair_shares and settings.worker.cpu_priorities,
        )
        self._slots.on_jobs_changed(self._priorities.update)
        self._consumer = JobConsumer(
            self._redis,
            self._writer,
            worker_id=self.id,
            slots=self._slots,
            max_concurrent_jobs=settings.worker.max_concurrent_jobs,
            fair_shares=settings.worker.fair_shares,
            max_shadow_jobs=settings.worker.max_shadow_jobs,
            max_batch_jobs=settings.worker.max_batch_jobs,
            batch_jobs_beside_interactive=settings.worker.batch_jobs_beside_interactive,
            max_deliveries=settings.worker.max_deliveries,
            takeover_check_s=settings.worker.takeover_check_s,
            orphan_grace_s=settings.worker.orphan_grace_s,
            # A worker that no longer takes jobs must not hold models (and replica leases) for nothing.
            on_failure=self._stop_requested.set,
        )
        # A loaded model's objects live until its unload: full collections need not walk them
        # while it is warm, and are collected once it is cold (each between jobs).
        self._heap_upkeep = HeapUpkeep(self._slots)
        self._heartbeat = Heartbeat(
            self._redis, self.record, settings.worker.heartbeat_s, healthy=self._healthy
        )
        self._controller = model_controller(
            settings.worker,
            models=self._models,
            worker_id=self.id,
            kind=self.kind,
            memory_budget_bytes=self.memory_budget,
            expected_footprint=self._placement.expected_footprint,
            redis=self._redis,
            poke_redis=self._poke_redis,
            slots=self._slots,
            consumer=self._consumer,
            coordination=self._coordination,
            advertise=self._heartbeat.beat,
            files=self._files,
        )
        # The LoRA adapters registered at run time: those of a base held here get slots as they come.
        self._adapters = AdapterRegistry(self._redis, settings.models)
        self._adapters.on_change(self._adapters_changed)
        self._metrics = MetricsServer(
            settings.worker.metrics_host,
            settings.worker.metrics_port,
            self._triton_metrics_url,
            ready=lambda: self._consumer.reading and not self._draining,
        )
        # The start-up steps that run beside serving (Triton, the engine runtime's import).
        self._tasks = TaskSet("worker")
        self._stop_lock = asyncio.Lock()
        self._stopped = False
        # Set while stopping: running jobs drain, and the record (still beating, so that no other
        # worker takes those jobs over) advertises no model.
        self._draining = False

    def record(self) -> WorkerRecord:
        """How this worker advertises itself."""
        held = [] if self._draining else self._slots.held()
        return WorkerRecord(
            id=self.id,
            host=socket.gethostname(),
            pid=os.getpid(),
            started=self.started,
            heartbeat=time.time(),
            models=tuple(slot.name for slot in held if slot.state == "warm"),
            triton_http_port=self._host.http_port,
            triton_grpc_port=self._host.grpc_port,
            triton_metrics_port=self._host.metrics_port,
            metrics_port=self._metrics.port,
            kind=self.kind,
            allowed=self._allowed,
            max_loaded_models=self.settings.worker.max_loaded_models,
            memory_budget_bytes=self.memory_budget,
            memory_used_bytes=sum(slot.memory_bytes() for slot in held),
            slots=tuple(slot.status() for slot in held),
            engines_ready=self._engines_ready,
            node=self._files.node_id,
            cached=self._files.cached(),
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
        """Advertise and take jobs at once; Triton and the engine runtime come up in the background."""
        await self._redis.ping()
        SLOTS.add(self.id, self._slots)
        try:
            await self._metrics.start()
        except OSError as exc:
            logger.warning(f"serving no metrics: {exc}", extra={"worker_id": self.id})
        self._writer.start()
        self._tasks.start(self._heap_upkeep.run(), "heap upkeep")
        await self._consumer.start()
        await self._heartbeat.start()
        self._in_background(self._prepare_loading(), "start Triton")
        self._in_background(self._prepare_engines(), "import the engine runtime")
        self._in_background(self._advertise_when_prepared(), "advertise the prepared engines")
        await self._controller.start()
        self._adapters.start(self._tasks)
        logger.info(
            f"worker ready: may hold {', '.join(self._slots)} "
            f"(at most {self.settings.worker.max_loaded_models} at once, "
            f"{self.memory_budget / 1024**3:.1f} GiB); models load on first request",
            extra={"worker_id": self.id, "kind": self.kind},
        )

    async def stop(self) -> None:
        """Stop deciding and taking jobs, drain, withdraw, unload everything; idempotent."""
        async with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            logger.info("worker stopping", extra={"worker_id": self.id})
            drain_s = self.settings.worker.drain_timeout_s
            # Jobs still waiting go to other workers from now on, even while a load in progress
            # holds the controller's stop back.
            self._draining = True
            await _stop_step("stop taking jobs", self._consumer.stop_taking())
            await _stop_step("stop the model controller", self._controller.stop(), STOP_STEP_TIMEOUT_S * 3)
            await _stop_step("advertise that nothing is served here", self._heartbeat.beat())
            await _stop_step("drain running jobs", self._consumer.stop(drain_s), drain_s)
            await _stop_step("withdraw the advertisement", self._heartbeat.stop())
            await _stop_step("flush result chunks", self._writer.stop())
            for slot in self._slots.values():
                await _stop_step(f"unload {slot.name}", self._unload_on_stop(slot))
            await _stop_step("end the background starts", self._tasks.stop())
            # Triton waits for its models to finish unloading: give it longer than other steps.
            await _stop_step("stop Triton", asyncio.to_thread(self._host.stop), STOP_STEP_TIMEOUT_S * 2)
            await _stop_step("close Redis connections", self._close_redis())
            await _stop_step("stop serving metrics", self._metrics.stop())
            SLOTS.remove(self.id)
            logger.info("worker stopped", extra={"worker_id": self.id})

    def _adapters_changed(self, added: list[ModelConfig], removed: list[str]) -> None:
        """Registered adapters came or went: the controller weighs, unloads and forgets them."""
        for name in removed:
            self._controller.retire(name)
        for adapter in added:
            if adapter.base in self._slots:
                self._controller.add_model(adapter)

    def _triton_metrics_url(self) -> str | None:
        """Where this worker's Triton serves its metrics, once it runs."""
        if not self._host_started.is_set():
            return None
        return f"http://127.0.0.1:{self._host.metrics_port}/metrics"

    def _healthy(self) -> bool:
        """Whether the heartbeat may go on: the worker takes jobs, or drains the ones it took."""
        return self._consumer.reading or self._draining

    # --- construction -----------------------------------------------------------------------

    def _create_engine(self, model: ModelConfig) -> Engine:
        """A new engine for `model`, computing on a share of the cores no other held model uses."""
        held = [slot.name for slot in self._slots.held()]
        return self._engine_factory(
            model, self._engine_options(self._placement.cpu_threads(model.name, held))
        )

    def _engine_options(self, cpu_threads: str | None) -> EngineOptions:
        worker = self.settings.worker
        return EngineOptions(
            cpu_threads=cpu_threads,
            cpu_kvcache_gib=worker.cpu_kvcache_gib,
            engine_process=worker.engine_process,
            memory_budget_bytes=self.memory_budget,
        )

    def _models_it_can_run(
        self, models: list[ModelConfig], engine_factory: EngineFactory
    ) -> list[ModelConfig]:
        """`models` less those whose engine this environment lacks; the record's `allowed` names
        what this worker may hold."""
        self._allowed = tuple(self.settings.worker.models)
        if engine_factory is not create_engine:  # scripted engines need no package
            return with_their_bases(models)
        try:
            runnable = with_their_bases(runnable_models(models))
        except NoRunnableModel as exc:
            raise CannotStart(str(exc)) from None
        if len(runnable) < len(models):
            self._allowed = tuple(model.name for model in runnable)
        return runnable

    # --- running ----------------------------------------------------------------------------

    async def _prepare_engines(self) -> None:
        """Import the engines' runtime (and start vLLM's fork server), then estimate footprints.

        Both import vLLM, which takes seconds: never on the event loop.
        """
        if self._engine_factory is create_engine:  # a scripted engine imports nothing
            engines: set[str] = {model.engine_name for model in self._models}
            await asyncio.to_thread(import_runtimes, engines, self.settings.worker.engine_process)
        if self._owns_process:
            # The engines' runtime lives as long as the process: full collections need not walk it.
            frozen = gc_heap.freeze_long_lived()
            logger.info(f"froze {frozen} long-lived objects out of garbage collection")
        for model in self._models:
            # A remote model's files may not be on this node: its footprint is measured at its first
            # load. An adapter takes its base's engine, whose footprint counts it.
            if model.base is None and not self._files.remote(model.name):
                await asyncio.to_thread(self._placement.estimate, model, self._estimator(model))
        self._engines_imported.set()

    async def _advertise_when_prepared(self) -> None:
        """Once Triton runs and the engines' runtime is imported, say so at once: a first request
        is answered in seconds from then on, and `switchboard up` waits for this to say it serves."""
        await self._host_started.wait()
        await self._engines_imported.wait()
        self._engines_ready = True
        if self._draining:
            return  # stopping: the record is withdrawn soon, and must not be written after that
        # The next regular beat says it anyway, should Redis not answer now.
        with contextlib.suppress(RedisError):
            await self._heartbeat.beat()

    def _estimator(self, model: ModelConfig) -> Callable[[], int]:
        """What an engine for `model` says it will occupy (it is made, not started)."""
        return lambda: self._engine_factory(model, self._engine_options(None)).footprint().memory_bytes

    async def _prepare_loading(self) -> None:
        """What every load needs first: Triton running, and the demo model built if it is served."""
        await asyncio.to_thread(self._host.start)
        for model in self._models:
            await asyncio.to_thread(prepare_model_files, model)
        self._host_started.set()

    def _in_background(self, work: Coroutine[Any, Any, Any], what: str) -> None:
        """Run a start-up step beside serving; a failure stops the worker (it cannot load anything)."""

        async def guarded() -> None:
            try:
                await work
            except Exception:
                logger.exception(f"could not {what}; stopping the worker")
                self._stop_requested.set()

        self._tasks.start(guarded(), what)

    async def _unload_on_stop(self, slot: ModelSlot) -> None:
        await slot.unload()
        await self._coordination.release_slot_lease(slot)

    async def _close_redis(self) -> None:
        await self._poke_redis.aclose()
        await self._redis.aclose()


async def _stop_step(name: str, step: Awaitable[object], extra_s: float = 0.0) -> None:
    """Run one step of stopping; a step that hangs or fails is logged and the next one still runs.

    Each step is logged as it begins: a worker killed while stopping shows where it hung.
    """
    logger.info("stopping: " + name)
    try:
        async with asyncio.timeout(STOP_STEP_TIMEOUT_S + extra_s):
            await step
    except Exception:
        logger.exception("a stop step failed; going on", extra={"step": name})


def run_worker(settings: Settings) -> None:
    """Entry point of `switchboard worker`; Triton and the engines end with this process, however it ends."""
    guard = descendants_guard.start()
    # Three threads of this process run Python for every job: the main loop (Redis, gRPC), each
    # generator's engine loop (vLLM's output handling, the coalescer) and gRPC's. A thread that
    # becomes ready waits for the one holding the GIL to drop it, up to the switch interval (5 ms by
    # default). bench/path_cpu.py, 4 alternating rounds: TTFT p50 14.4-17.9 ms at one stream
    # against 15.3-18.8, 34 against 41 ms (medians) at 8, the same CPU per request.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    configure_tracing("switchboard-worker")
    gc_heap.observe_pauses()
    try:
        try:
            worker = Worker(settings, owns_process=True)
        except CannotStart as exc:
            raise SystemExit(f"switchboard worker: {exc}") from None
        # Before Triton and the engines start: what they create is this user's alone.
        with private_process_files():
            asyncio.run(worker.run())
    finally:
        guard.terminate()


def with_their_bases(models: list[ModelConfig]) -> list[ModelConfig]:
    """`models` less the adapters whose base is not among them (they run on its engine alone)."""
    names = {model.name for model in models}
    return [model for model in models if model.base is None or model.base in names]
