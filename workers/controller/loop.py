"""The model controller of one worker: read a snapshot, ask the policy, carry out its actions.

One task per worker. Each pass renews this worker's replica leases, reads the snapshot, asks the
pure policy (`decide`) what to do, logs each committed action once with its reason, and starts the
slot transitions. A pass runs on every tick and whenever the demand stream is poked (an enqueue, an
operator request, a transition that ended somewhere). Loads run one at a time on a worker; each is
timed, and the time is kept in Redis per model and worker kind for every later decision.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, cast

import redis.asyncio as aioredis

from switchboard import keys
from switchboard.config import ModelConfig
from switchboard.demand import poke_demand
from switchboard.redis_conn import stream_entries
from switchboard.tasks import TaskSet
from switchboard.wire import JobError
from workers.controller.actions import Action, Load, Sleep, Unload, Wake
from workers.controller.coordination import Coordination
from workers.controller.policy import decide
from workers.controller.snapshot import LocalFacts, SnapshotReader
from workers.controller.view import View, WorkerLimits
from workers.jobs.consume import JobConsumer
from workers.models.slot import LoadFailed, ModelSlot
from workers.runtime import metrics

logger = logging.getLogger(__name__)

PROGRESS_EVERY_S = 5.0
# The least time from one pass's start to the next one's (asyncio.sleep of a negative time returns
# at once): a cold model's first request waits at most this much more for its load to start.
MIN_PASS_INTERVAL_S = 0.1


class Backoff:
    """How long a model that keeps failing to load is left alone: doubling, up to a ceiling."""

    def __init__(self, first_s: float, max_s: float) -> None:
        self._first_s = first_s
        self._max_s = max_s
        self._failures: dict[str, int] = {}
        self._until: dict[str, float] = {}

    def failed(self, model: str) -> tuple[float, int]:
        """Count a failure; returns (seconds to wait, failures in a row)."""
        count = self._failures.get(model, 0) + 1
        self._failures[model] = count
        wait_s = min(self._max_s, self._first_s * 2 ** (count - 1))
        self._until[model] = time.time() + wait_s
        return wait_s, count

    def succeeded(self, model: str) -> bool:
        """Forget the model's failures; returns whether it had any."""
        self._until.pop(model, None)
        return self._failures.pop(model, 0) > 0

    def until(self) -> dict[str, float]:
        """When each failing model may be tried again here (unix seconds)."""
        return dict(self._until)


class ModelController:
    """Decides and carries out what this worker loads, keeps, puts to sleep and unloads."""

    def __init__(
        self,
        *,
        redis: aioredis.Redis,
        poke_redis: aioredis.Redis,
        slots: Mapping[str, ModelSlot],
        models: list[ModelConfig],
        consumer: JobConsumer,
        coordination: Coordination,
        snapshot: SnapshotReader,
        worker_id: str,
        limits: WorkerLimits,
        backoff: Backoff,
        tick_s: float,
        advertise: Callable[[], Awaitable[None]],
    ) -> None:
        self._redis = redis
        self._poke_redis = poke_redis
        self._slots = slots
        self._consumer = consumer
        self._coordination = coordination
        self._snapshot = snapshot
        self._worker_id = worker_id
        self._limits = limits
        self._backoff = backoff
        self._tick_ms = max(1, int(tick_s * 1000))
        self._advertise = advertise
        self._preload_pending = {m.name for m in models if m.preload}
        self._transitions: dict[str, asyncio.Future[None]] = {}
        self._announcements: set[asyncio.Future[None]] = set()
        self._demand_last_id: bytes = b"0-0"
        self._tasks = TaskSet("model controller")

    async def start(self) -> None:
        """Start deciding, from the demand stream's current end."""
        newest = await self._redis.xrevrange(keys.demand_stream(), count=1)
        if newest:
            self._demand_last_id = cast(bytes, newest[0][0])
        self._tasks.start(self._run(), "decide")

    async def stop(self) -> None:
        """Stop deciding; let transitions in progress end (a load cannot be interrupted)."""
        await self._tasks.stop()
        if self._transitions:
            await asyncio.gather(*self._transitions.values(), return_exceptions=True)

    async def poke(self) -> None:
        """Wake every worker's controller: something changed that may call for a decision."""
        pipe = self._redis.pipeline(transaction=False)
        poke_demand(pipe)
        await pipe.execute()

    async def _run(self) -> None:
        while True:
            started = asyncio.get_running_loop().time()
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("a controller pass failed; going on")
            await self._wait_for_poke()
            # Every enqueue pokes: under load, the pokes of a moment share one pass instead of
            # costing every worker a snapshot per request.
            await asyncio.sleep(started + MIN_PASS_INTERVAL_S - asyncio.get_running_loop().time())

    async def step(self) -> None:
        """One pass: renew leases, read the snapshot, decide, commit."""
        await self._renew_leases()
        view = await self._snapshot.read(self._local_facts())
        self._preload_pending -= {m.name for m in view.models if m.replicas > 0}
        actions = [a for a in decide(view) if a.model not in self._transitions]
        load = next((a for a in actions if isinstance(a, Load)), None)
        if load is not None and not await self._coordination.take_lease(load.model, load.replica):
            # Another worker adds this replica: nothing is evicted for it here.
            actions = [a for a in actions if a is not load and getattr(a, "for_model", None) != load.model]
        evictions: list[asyncio.Future[None]] = []
        for action in actions:
            task = self._commit(action, view, evictions)
            if isinstance(action, Unload) and action.for_model is not None:
                evictions.append(task)

    async def _wait_for_poke(self) -> None:
        try:
            response = await self._poke_redis.xread(
                {keys.demand_stream(): self._demand_last_id}, block=self._tick_ms
            )
        except (ConnectionError, OSError, aioredis.RedisError):
            logger.warning("waiting for demand failed; retrying", exc_info=True)
            await asyncio.sleep(self._tick_ms / 1000)
            return
        for _, entries in stream_entries(response):
            self._demand_last_id = entries[-1][0]

    def _local_facts(self) -> LocalFacts:
        starting = frozenset(name for name in self._transitions if self._slots[name].state == "cold")
        return LocalFacts(
            worker_id=self._worker_id,
            limits=self._limits,
            starting=starting,
            preload_pending=frozenset(self._preload_pending),
            backoff_until=self._backoff.until(),
        )

    async def _renew_leases(self) -> None:
        held = [(name, slot.replica) for name, slot in self._slots.items() if slot.replica is not None]
        for model, replica in await self._coordination.renew_leases(held):
            if not await self._coordination.take_lease(model, replica):
                logger.warning(
                    "lost the lease of a replica; it is no longer counted",
                    extra={"model": model, "replica": replica},
                )
                self._slots[model].replica = None

    # --- committing actions -----------------------------------------------------------------

    def _commit(
        self, action: Action, view: View, evictions: list[asyncio.Future[None]]
    ) -> asyncio.Future[None]:
        """Log the action once and start its transition (a Load's lease is already taken)."""
        model = action.model
        slot = self._slots[model]
        if isinstance(action, Load):
            slot.replica = action.replica
            slot.expected_load_s = view.model(model).load_s
            logger.info(
                f"loading {model} (replica {action.replica}): {action.why}; {_expected(slot)}",
                extra={"action": "load", "model": model, "replica": action.replica, "why": action.why},
            )
            requested = view.model(model).load_requested
            return self._start(model, self._load(slot, action.replica, requested, evictions))
        if isinstance(action, Wake):
            logger.info(f"waking {model}: {action.why}", extra=_fields(action))
            slot.expected_load_s = view.model(model).wake_s
            return self._start(model, self._wake(slot, view.model(model).load_requested))
        if isinstance(action, Sleep):
            logger.info(f"putting {model} to sleep: {action.why}", extra=_fields(action))
            return self._start(model, self._sleep(slot))
        logger.info(f"unloading {model}: {action.why}", extra=_fields(action))
        if action.for_model is not None:
            metrics.MODEL_EVICTIONS.labels(model).inc()
        return self._start(model, self._unload(slot))

    def _start(self, model: str, transition: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        task = asyncio.ensure_future(transition)
        self._transitions[model] = task
        task.add_done_callback(lambda _: self._transition_ended(model))
        return task

    def _transition_ended(self, model: str) -> None:
        self._transitions.pop(model, None)
        announcement = asyncio.ensure_future(self._announce())
        self._announcements.add(announcement)
        announcement.add_done_callback(self._announcements.discard)

    async def _announce(self) -> None:
        """Tell everyone (this controller too): an unload frees room, a load changes the holders."""
        try:
            await self._advertise()
            await self.poke()
        except Exception:
            logger.warning("could not announce a finished transition", exc_info=True)

    async def _load(
        self, slot: ModelSlot, replica: int, requested: bool, evictions: list[asyncio.Future[None]]
    ) -> None:
        # Room first: the models evicted for this one release their memory before it loads.
        await asyncio.gather(*evictions, return_exceptions=True)
        started = time.monotonic()
        await self._advertise()
        progress = asyncio.create_task(self._report_progress(slot, started))
        try:
            await slot.ensure_warm()
        except LoadFailed as exc:
            metrics.MODEL_LOADS.labels(slot.name, "failed").inc()
            serving_elsewhere = any(
                s.state == "warm" for s in await self._snapshot.holders_elsewhere(slot.name, self._worker_id)
            )
            await self._load_failed(slot, replica, str(exc), time.monotonic() - started, serving_elsewhere)
            return
        finally:
            progress.cancel()
        seconds = time.monotonic() - started
        metrics.MODEL_LOADS.labels(slot.name, "ok").inc()
        metrics.MODEL_LOAD_TIME.labels(slot.name).observe(seconds)
        logger.info(
            f"{slot.name} is warm after {seconds:.1f} s",
            extra={"model": slot.name, "seconds": round(seconds, 2), "replica": replica},
        )
        if self._backoff.succeeded(slot.name):
            await self._coordination.clear_failure(slot.name)
        await self._coordination.record_cost(slot.name, "load", seconds)
        await self._coordination.record_cost(slot.name, "memory", slot.memory_bytes())
        limits = slot.engine.limits() if slot.engine is not None else None
        if limits is not None:
            await self._coordination.publish_limits(slot.name, limits)
        if requested:
            await self._coordination.consume_load_request(slot.name)

    async def _load_failed(
        self, slot: ModelSlot, replica: int, reason: str, seconds: float, serving_elsewhere: bool
    ) -> None:
        slot.replica = None
        await self._coordination.release_lease(slot.name, replica)
        backoff_s, in_a_row = self._backoff.failed(slot.name)
        logger.error(
            f"{slot.name} failed to load after {seconds:.1f} s: {reason}; not retried for {backoff_s:.0f} s",
            extra={"model": slot.name, "reason": reason, "backoff_s": backoff_s, "failures": in_a_row},
        )
        if serving_elsewhere:
            return  # requests keep going to the replicas that work; only this worker backs off
        await self._coordination.record_failure(slot.name, reason, backoff_s, in_a_row)
        error = JobError(code="load_failed", message=reason, retry_after_s=backoff_s)
        refused = await self._consumer.refuse_waiting(slot.name, error)
        if refused:
            logger.info(f"answered {refused} waiting requests for {slot.name} with the load failure")

    async def _wake(self, slot: ModelSlot, requested: bool) -> None:
        started = time.monotonic()
        try:
            await slot.ensure_warm()
        except LoadFailed as exc:
            metrics.MODEL_WAKES.labels(slot.name, "failed").inc()
            logger.error(f"{slot.name} failed to wake: {exc}; unloading it", extra={"model": slot.name})
            await self._unload(slot)
            return
        seconds = time.monotonic() - started
        metrics.MODEL_WAKES.labels(slot.name, "ok").inc()
        metrics.MODEL_WAKE_TIME.labels(slot.name).observe(seconds)
        logger.info(f"{slot.name} is awake after {seconds:.2f} s", extra={"model": slot.name})
        await self._coordination.record_cost(slot.name, "wake", seconds)
        if requested:
            await self._coordination.consume_load_request(slot.name)

    async def _sleep(self, slot: ModelSlot) -> None:
        started = time.monotonic()
        await slot.sleep()
        seconds = time.monotonic() - started
        metrics.MODEL_SLEEPS.labels(slot.name).inc()
        logger.info(f"{slot.name} is asleep after {seconds:.2f} s", extra={"model": slot.name})
        await self._coordination.record_cost(slot.name, "sleep", seconds)

    async def _unload(self, slot: ModelSlot) -> None:
        started = time.monotonic()
        await slot.unload()
        if slot.replica is not None:
            await self._coordination.release_lease(slot.name, slot.replica)
            slot.replica = None
        seconds = time.monotonic() - started
        metrics.MODEL_UNLOADS.labels(slot.name).inc()
        logger.info(f"{slot.name} unloaded in {seconds:.1f} s", extra={"model": slot.name})
        await self._coordination.record_cost(slot.name, "unload", seconds)

    async def _report_progress(self, slot: ModelSlot, started: float) -> None:
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            elapsed = time.monotonic() - started
            about = f" of about {slot.expected_load_s:.0f} s" if slot.expected_load_s else ""
            logger.info(f"still loading {slot.name}: {elapsed:.0f} s{about}", extra={"model": slot.name})


def _expected(slot: ModelSlot) -> str:
    if slot.expected_load_s is None:
        return "first load on this kind of worker"
    return f"usually takes {slot.expected_load_s:.1f} s"


def _fields(action: Action) -> dict[str, str]:
    return {"action": type(action).__name__.lower(), "model": action.model, "why": action.why}
