"""The model controller of one worker: read a snapshot, ask the policy, carry out its actions.

One task per worker. Each pass renews this worker's replica leases, reads the snapshot, asks the
pure policy (`decide`) what to do, logs each committed action once with its reason, and starts the
slot transitions. Everything outside the loop (Redis, the slots, the consumer) goes through one
`ControllerEffects`. A pass runs on every tick and whenever the demand stream is poked (an enqueue, an
operator request, a transition that ended somewhere) about a model this worker could hold, or about
any. Loads run one at a time on a worker; each is timed, and the time is kept in Redis per model and
worker kind for every later decision: the engine's start apart from the fetch of a remote model's
files (whose size is kept too), since a node that has the files pays only the first. A prefetch
fetches a model's files into the node cache beside the loads, one at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from switchboard.config import ModelConfig
from switchboard.tasks import TaskSet, poll
from switchboard.wire import JobError
from workers.controller.actions import Action, Load, Prefetch, Sleep, Unload, Wake
from workers.controller.effects import ControllerEffects
from workers.controller.policy import decide
from workers.controller.snapshot import LocalFacts
from workers.controller.view import ModelView, View, WorkerLimits
from workers.engines.base import AdapterRefused
from workers.models.files import FetchFailed
from workers.models.slot import LoadFailed
from workers.runtime import worker_metrics as metrics

logger = logging.getLogger(__name__)

PROGRESS_EVERY_S = 5.0
# The least time from one pass's start to the next one's (asyncio.sleep of a negative time returns
# at once): a cold model's first request waits at most this much more for its load to start.
MIN_PASS_INTERVAL_S = 0.1
# The same after a poke about an adapter that loads at once here (its base is warm here).
ADAPTER_PASS_INTERVAL_S = 0.01
# How long a pass that a poke set off waits after it. Every enqueue pokes every worker, and the job
# that poked is mostly one a warm model's consumer takes at once, on the same event loop: a pass run
# at once took that loop first (its lease renewal, snapshot and decisions, 1-2 ms here) while the
# job waited to be taken and then for its first token. After the wait the job has started, and the
# pass sees the queue as the consumers left it; a cold model's load starts this much later.
POKE_SETTLE_S = 0.03
# The reason a failed load gives everyone else (clients, the operator's status); the worker logs the real one.
LOAD_FAILED_REASON = "the worker's log has the reason"


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
        effects: ControllerEffects,
        models: list[ModelConfig],
        worker_id: str,
        limits: WorkerLimits,
        backoff: Backoff,
        tick_s: float,
    ) -> None:
        self._effects = effects
        self._worker_id = worker_id
        self._limits = limits
        self._backoff = backoff
        self._tick_s = tick_s
        self._preload_pending = {m.name for m in models if m.preload}
        self._transitions: dict[str, asyncio.Future[None]] = {}
        # Fetches of models' files ahead of their loads (they hold no slot).
        self._prefetches: dict[str, asyncio.Future[None]] = {}
        self._announcements: set[asyncio.Future[None]] = set()
        # Adapters whose registration was removed, to unload (if held) and forget between transitions;
        # and those registered again meanwhile, to add once the old slot is gone.
        self._retiring: set[str] = set()
        self._returning: dict[str, ModelConfig] = {}
        self._tasks = TaskSet("model controller")

    async def start(self) -> None:
        """Start deciding, from the demand stream's current end."""
        await self._effects.follow_demand()
        self._tasks.start(self._run(), "decide")

    async def stop(self) -> None:
        """Stop deciding; let transitions in progress end (a load cannot be interrupted)."""
        await self._tasks.stop()
        for prefetch in self._prefetches.values():
            prefetch.cancel()  # the node cache resumes a fetch cut short, whoever asks next
        pending = [*self._transitions.values(), *self._prefetches.values()]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    def add_model(self, model: ModelConfig) -> None:
        """Weigh `model` (an adapter registered at run time) from the next pass, where this worker may
        hold it."""
        if model.name in self._retiring or model.name in self._transitions:
            self._returning[model.name] = model  # added once the removed one's slot is gone
        elif not self._effects.has_slot(model.name):
            self._effects.add_model(model)

    def retire(self, name: str) -> None:
        """`name`'s registration was removed: weigh it no more, unload it if held, forget its slot."""
        self._returning.pop(name, None)
        if self._effects.has_slot(name):
            self._effects.stop_weighing(name)
            self._retiring.add(name)

    async def _run(self) -> None:
        trigger = "tick"
        while True:
            started = asyncio.get_running_loop().time()
            try:
                await self._timed_step(trigger)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("a controller pass failed; going on")
            trigger = await self._wait(started)
            # Every enqueue pokes: under load, the pokes of a moment share one pass instead of
            # costing every worker a snapshot per request.
            # An adapter's load onto its warm base takes milliseconds: neither the settle nor the
            # pass interval, each longer than that load, is worth its first token's wait; a shorter
            # interval still bounds the passes a stream of such pokes can cost.
            interval_s = ADAPTER_PASS_INTERVAL_S if trigger == "adapter" else MIN_PASS_INTERVAL_S
            now = asyncio.get_running_loop().time()
            settle_s = POKE_SETTLE_S if trigger == "poke" else 0.0
            if await self._rest_until(max(started + interval_s, now + settle_s), started):
                trigger = "adapter"

    async def _rest_until(self, until: float, started: float) -> bool:
        """Wait until `until` between passes; True, early, once a poke names an adapter that loads at
        once here (at least ADAPTER_PASS_INTERVAL_S after `started`). Under churn, the pokes that end
        every transition set the 100 ms pace: a cold adapter's poke arriving meanwhile waited it out."""
        loop = asyncio.get_running_loop()
        while (left_s := until - loop.time()) > 0:
            named = await self._effects.wait_for_demand(max(1, int(left_s * 1000)))
            if any(self._effects.loads_at_once(model) for model in named if model):
                await asyncio.sleep(max(0.0, started + ADAPTER_PASS_INTERVAL_S - loop.time()))
                return True
        return False

    async def _wait(self, started: float) -> str:
        """Wait for a poke about a model this worker could hold (or about any), or for the tick after
        `started`; returns which came ("poke", "adapter" for a poke about an adapter that loads at
        once here, or "tick")."""
        loop = asyncio.get_running_loop()
        tick_at = started + self._tick_s
        while True:
            left_ms = int((tick_at - loop.time()) * 1000)
            if left_ms <= 0:
                return "tick"
            named = await self._effects.wait_for_demand(left_ms)
            if any(self._effects.loads_at_once(model) for model in named if model):
                return "adapter"
            if any(model == "" or self._effects.may_hold(model) for model in named):
                return "poke"

    async def _timed_step(self, trigger: str) -> None:
        started = time.perf_counter()
        try:
            await self.step()
        finally:
            metrics.CONTROLLER_PASSES.labels(trigger).inc()
            metrics.CONTROLLER_PASS_TIME.observe(time.perf_counter() - started)

    async def step(self) -> None:
        """One pass: renew leases, unload the models whose engine ended, read the snapshot, decide,
        commit."""
        await self._renew_leases()
        self._unload_ended_engines()
        self._retire_removed()
        view = await self._effects.read_view(self._local_facts())
        self._preload_pending -= {m.name for m in view.models if m.replicas > 0}
        actions = self._startable(decide(view))
        load = next((a for a in actions if isinstance(a, Load)), None)
        if load is not None and not await self._effects.take_lease(load.model, load.replica):
            # Another worker adds this replica: nothing is evicted for it here.
            actions = [a for a in actions if a is not load and getattr(a, "for_model", None) != load.model]
        evictions: list[asyncio.Future[None]] = []
        for action in actions:
            if isinstance(action, Prefetch):
                self._start_prefetch(action)
                continue
            task = self._commit(action, view, evictions)
            if isinstance(action, Unload) and action.for_model is not None:
                evictions.append(task)

    def _startable(self, actions: list[Action]) -> list[Action]:
        """The actions whose model is in no transition now. The view was read while transitions ran:
        an eviction planned for a model already on its way, or a load whose eviction is already under
        way for another, would act twice; they wait for the next pass."""
        busy = self._transitions.keys()
        stale = {
            a.for_model
            for a in actions
            if isinstance(a, Unload) and a.for_model is not None and a.model in busy
        }
        waiting = busy | stale
        return [a for a in actions if a.model not in waiting and getattr(a, "for_model", None) not in waiting]

    def _unload_ended_engines(self) -> None:
        """A model whose engine can no longer generate is unloaded here; its jobs wait in its stream
        (the consumer reads it no more) and its next load, here or elsewhere, serves them."""
        for model, why in self._effects.engines_ended().items():
            if model in self._transitions:
                continue
            logger.error(
                f"unloading {model}: {why}; it loads again when asked for",
                extra={"action": "unload", "model": model, "why": why},
            )
            metrics.ENGINES_ENDED.labels(model).inc()
            self._start(model, self._unload(model))

    def _retire_removed(self) -> None:
        """Start the retirement of each removed model not in a transition now."""
        for model in sorted(self._retiring - self._transitions.keys()):
            self._retiring.discard(model)
            self._start(model, self._retire(model))

    async def _retire(self, model: str) -> None:
        if not self._effects.is_cold(model):
            logger.info(f"unloading {model}: its registration was removed", extra={"model": model})
            await self._unload(model)
        await self._effects.forget(model)
        returning = self._returning.pop(model, None)
        if returning is not None:
            self._effects.add_model(returning)

    def _local_facts(self) -> LocalFacts:
        starting = frozenset(name for name in self._transitions if self._effects.is_cold(name))
        return LocalFacts(
            worker_id=self._worker_id,
            limits=self._limits,
            starting=starting,
            preload_pending=frozenset(self._preload_pending),
            backoff_until=self._backoff.until(),
        )

    async def _renew_leases(self) -> None:
        for model, replica in await self._effects.renew_leases():
            logger.warning(
                "lost the lease of a replica; it is no longer counted",
                extra={"model": model, "replica": replica},
            )

    # --- committing actions -----------------------------------------------------------------

    def _commit(
        self, action: Load | Wake | Sleep | Unload, view: View, evictions: list[asyncio.Future[None]]
    ) -> asyncio.Future[None]:
        """Log the action once and start its transition (a Load's lease is already taken)."""
        model = view.model(action.model)
        if isinstance(action, Load):
            logger.info(
                f"loading {model.name} (replica {action.replica}): {action.why}; {_expected(model)}",
                extra={"action": "load", "model": model.name, "replica": action.replica, "why": action.why},
            )
            expected_s = _expected_load_s(model)
            load = self._load(model.name, action.replica, expected_s, model.load_requested, evictions)
            return self._start(model.name, load)
        if isinstance(action, Wake):
            logger.info(f"waking {model.name}: {action.why}", extra=_fields(action))
            return self._start(model.name, self._wake(model.name, model.wake_s, model.load_requested))
        if isinstance(action, Sleep):
            logger.info(f"putting {model.name} to sleep: {action.why}", extra=_fields(action))
            return self._start(model.name, self._sleep(model.name))
        logger.info(f"unloading {model.name}: {action.why}", extra=_fields(action))
        if action.for_model is not None:
            metrics.MODEL_EVICTIONS.labels(model.name).inc()
        return self._start(model.name, self._unload(model.name))

    def _start(self, model: str, transition: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        task = asyncio.ensure_future(transition)
        self._transitions[model] = task
        task.add_done_callback(lambda _: self._transition_ended(model))
        return task

    def _start_prefetch(self, action: Prefetch) -> None:
        """Fetch the model's files into the node cache beside any transition; a failure is logged."""
        if action.model in self._prefetches:
            return
        logger.info(f"prefetching {action.model}: {action.why}", extra=_fields(action))

        async def prefetch() -> None:
            try:
                await self._effects.prefetch(action.model)
            except FetchFailed as exc:
                logger.error(f"could not prefetch {action.model}: {exc}", extra={"model": action.model})
            else:
                await self._effects.advertise()  # every controller sees the files here at once

        task = asyncio.ensure_future(prefetch())
        self._prefetches[action.model] = task
        task.add_done_callback(lambda _: self._prefetches.pop(action.model, None))

    def _transition_ended(self, model: str) -> None:
        self._transitions.pop(model, None)
        announcement = asyncio.ensure_future(self._announce())
        self._announcements.add(announcement)
        announcement.add_done_callback(self._announcements.discard)

    async def _announce(self) -> None:
        """Tell everyone (this controller too): an unload frees room, a load changes the holders."""
        try:
            await self._effects.advertise()
            await self._effects.poke()
        except Exception:
            logger.warning("could not announce a finished transition", exc_info=True)

    async def _load(
        self,
        model: str,
        replica: int,
        expected_s: float | None,
        requested: bool,
        evictions: list[asyncio.Future[None]],
    ) -> None:
        # Room first: the models evicted for this one release their memory before it loads.
        await asyncio.gather(*evictions, return_exceptions=True)
        started = time.monotonic()
        await self._effects.advertise()
        progress = asyncio.create_task(_report_progress(model, expected_s, started))
        try:
            await self._effects.load(model, expected_s)
        except LoadFailed as exc:
            metrics.MODEL_LOADS.labels(model, "failed").inc()
            serving_elsewhere = await self._effects.serving_elsewhere(model)
            # A fetch's failure names only the model's own location and its store's answer: the
            # operator sees it in `/admin/models` too, not in the log alone.
            # A fetch's or an adapter's failure says what an operator can fix (never the client).
            told = isinstance(exc.__cause__, FetchFailed | AdapterRefused)
            detail = str(exc.__cause__) if told else ""
            await self._load_failed(model, str(exc), time.monotonic() - started, serving_elsewhere, detail)
            return
        finally:
            progress.cancel()
        seconds = time.monotonic() - started
        metrics.MODEL_LOADS.labels(model, "ok").inc()
        metrics.MODEL_LOAD_TIME.labels(model).observe(seconds)
        fetch_s, files_bytes = self._effects.fetched(model)
        fetched = f" ({fetch_s:.1f} s of it for its files)" if fetch_s >= 0.05 else ""
        logger.info(
            f"{model} is warm after {seconds:.1f} s{fetched}",
            extra={"model": model, "seconds": round(seconds, 2), "replica": replica},
        )
        if self._backoff.succeeded(model):
            await self._effects.clear_failure(model)
        # The engine's start alone: a load on a node with the files pays no fetch.
        await self._effects.record_cost(model, "load", max(seconds - fetch_s, 0.0))
        if files_bytes:
            await self._effects.record_cost(model, "files", files_bytes)
        await self._effects.record_cost(model, "memory", self._effects.memory_bytes(model))
        await self._effects.publish_limits(model)
        if requested:
            await self._effects.consume_load_request(model)

    async def _load_failed(
        self, model: str, reason: str, seconds: float, serving_elsewhere: bool, detail: str = ""
    ) -> None:
        await self._effects.release_lease(model)
        backoff_s, in_a_row = self._backoff.failed(model)
        logger.error(
            f"{model} failed to load after {seconds:.1f} s: {reason}; not retried for {backoff_s:.0f} s",
            extra={"model": model, "reason": reason, "backoff_s": backoff_s, "failures": in_a_row},
        )
        if serving_elsewhere:
            return  # requests keep going to the replicas that work; only this worker backs off
        # What the engine said (a model's path, a library's error) stays in the log above: the
        # failure mark and the waiting requests' errors reach every caller and `/admin/models`.
        await self._effects.record_failure(model, LOAD_FAILED_REASON, backoff_s, in_a_row, detail)
        error = JobError(code="load_failed", message=LOAD_FAILED_REASON, retry_after_s=backoff_s)
        refused = await self._effects.refuse_waiting(model, error)
        if refused:
            logger.info(f"answered {refused} waiting requests for {model} with the load failure")

    async def _wake(self, model: str, expected_s: float | None, requested: bool) -> None:
        started = time.monotonic()
        try:
            await self._effects.wake(model, expected_s)
        except LoadFailed as exc:
            metrics.MODEL_WAKES.labels(model, "failed").inc()
            logger.error(f"{model} failed to wake: {exc}; unloading it", extra={"model": model})
            await self._unload(model)
            return
        seconds = time.monotonic() - started
        metrics.MODEL_WAKES.labels(model, "ok").inc()
        metrics.MODEL_WAKE_TIME.labels(model).observe(seconds)
        logger.info(f"{model} is awake after {seconds:.2f} s", extra={"model": model})
        await self._effects.record_cost(model, "wake", seconds)
        if requested:
            await self._effects.consume_load_request(model)

    async def _sleep(self, model: str) -> None:
        started = time.monotonic()
        await self._effects.sleep(model)
        seconds = time.monotonic() - started
        metrics.MODEL_SLEEPS.labels(model).inc()
        logger.info(f"{model} is asleep after {seconds:.2f} s", extra={"model": model})
        await self._effects.record_cost(model, "sleep", seconds)

    async def _unload(self, model: str) -> None:
        started = time.monotonic()
        await self._effects.unload(model)
        await self._effects.release_lease(model)
        seconds = time.monotonic() - started
        metrics.MODEL_UNLOADS.labels(model).inc()
        logger.info(f"{model} unloaded in {seconds:.1f} s", extra={"model": model})
        await self._effects.record_cost(model, "unload", seconds)


async def _report_progress(model: str, expected_s: float | None, started: float) -> None:
    async def report() -> None:
        elapsed = time.monotonic() - started
        about = f" of about {expected_s:.0f} s" if expected_s else ""
        logger.info(f"still loading {model}: {elapsed:.0f} s{about}", extra={"model": model})

    await poll(report, PROGRESS_EVERY_S, f"report the progress of loading {model}", log=logger)


def _expected_load_s(model: ModelView) -> float | None:
    """How long the load should take: the engine's start, and the fetch of its files if need be."""
    if model.load_s is None:
        return None
    return model.load_s + (model.download_s or 0.0)


def _expected(model: ModelView) -> str:
    if model.load_s is None:
        return "first load on this kind of worker"
    fetch = f" + about {model.download_s:.1f} s to fetch its files" if model.download_s else ""
    return f"usually takes {model.load_s:.1f} s{fetch}"


def _fields(action: Action) -> dict[str, str]:
    return {"action": type(action).__name__.lower(), "model": action.model, "why": action.why}
