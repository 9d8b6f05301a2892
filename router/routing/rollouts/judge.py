"""The judge of running rollouts: one task per front door, one judging front door per route.

Every TICK_S each front door looks at its routes. For a route whose rollout runs it tries to hold
the route's lease (`keys.rollout_lease`: its router id, set only if absent, with an expiry LEASE_MS
ahead that the holder renews each tick), so that one front door at a time judges it; when the holder
dies its lease expires, another front door takes it and goes on from the state in Redis. The holder
reads the state and writes the next one with the weights in one transaction that WATCHes the lease
and the route: a holder that lost its lease meanwhile, or an operator's abort, makes it write nothing.

What the holder does, by phase (`switchboard.rollout`):
- warming: asks the workers to load the canary (as `POST /admin/models/{name}/load`) and waits
  until a live worker holds it warm, then gives it the first step's weight; a canary whose load
  failed, or not warm within the plan's `warm_timeout_s`, rolls back;
- stepping, holding: once a step has lasted the interval and the canary served enough requests in
  its window, judges the window (`verdict`): a pass moves to the next step (or promotes, from the
  hold at 100 %), a failure counts, and enough failures, or a fatal failure rate, roll back: the
  canary's weight goes to 0 at once, a WARNING names the reason, and the jobs still waiting for the
  canary move to stable's queue.

Every front door also reports each route's live weights (`switchboard:route_weight`).
"""

from __future__ import annotations

import logging
import time

import redis.asyncio as aioredis
from redis.exceptions import RedisError, WatchError

from router.queue.move_waiting import move_waiting_jobs
from router.routing.routes.route_table import RouteTable
from router.status.desired import request_model_state
from router.status.model_status import ModelStatusReader
from router.telemetry.front_door_metrics import ROLLOUT_EVENTS, ROUTE_WEIGHT
from router.telemetry.rollout_observations import Observations, read_window
from switchboard import keys
from switchboard.rollout import Phase, RolloutState, after_check, decode_state, verdict
from switchboard.routes import ROLLOUT_FIELD, Route, stage_weights
from switchboard.tasks import TaskSet, poll

logger = logging.getLogger(__name__)

TICK_S = 1.0
# A judge silent this long has lost its lease to the next front door that asks.
LEASE_MS = 5000
# A warming canary's load is asked for again this often (a desired state expires; a worker may have
# started since).
LOAD_AGAIN_S = 30.0
TARGETS_CHANGED = "the route's targets changed in the config"


class RolloutJudge:
    """Judges the rollouts of one front door's routes whose lease it holds."""

    def __init__(
        self,
        redis: aioredis.Redis,
        routes: RouteTable,
        status: ModelStatusReader,
        router_id: str,
        observations: Observations,
    ) -> None:
        self._redis = redis
        self._observations = observations
        self._routes = routes
        self._status = status
        self._router_id = router_id
        # Rollout id → when this front door last asked for its canary's load.
        self._load_asked: dict[str, float] = {}

    def start(self, tasks: TaskSet) -> None:
        """Judge every TICK_S, and count and flush the rollouts' observations, while `tasks` runs."""
        self._observations.watch(self._routes)
        self._observations.start(self._redis, tasks)
        if self._routes.names():
            tasks.start(poll(self.tick, TICK_S, "judge the rollouts", log=logger), "rollout judge")

    async def stop(self) -> None:
        """Stop reading this front door's routes; send what it counted (Redis still open)."""
        self._observations.unwatch(self._routes)
        try:
            await self._observations.flush(self._redis)
        except RedisError as exc:
            logger.warning("could not flush the rollouts' observations", extra={"error": str(exc)})

    async def tick(self) -> None:
        """Report every route's weights; judge each running rollout whose lease this front door holds."""
        for name in self._routes.names():
            route = self._routes.get(name)
            if route is None:
                continue
            for model, weight in route.weight_map().items():
                ROUTE_WEIGHT.labels(name, model).set(weight)
            if route.rollout is not None and route.rollout.running and await self._hold_lease(name):
                await self._judge(route)

    async def _hold_lease(self, name: str) -> bool:
        """Take route `name`'s lease if nobody holds it, renew it if this front door does; whether it does."""
        key = keys.rollout_lease(name)
        if await self._redis.set(key, self._router_id, nx=True, px=LEASE_MS):
            logger.info("judging a route's rollout", extra={"route": name, "router_id": self._router_id})
            return True
        async with self._redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(key)
                if await pipe.get(key) != self._router_id.encode():
                    return False
                pipe.multi()
                pipe.pexpire(key, LEASE_MS)
                await pipe.execute()
            except WatchError:
                return False
        return True

    async def _judge(self, route: Route) -> None:
        """One step of the rollout of `route`: read its state, write the next, act on it."""
        route_key, lease_key = keys.route(route.name), keys.rollout_lease(route.name)
        async with self._redis.pipeline(transaction=True) as pipe:
            await pipe.watch(lease_key, route_key)
            if await pipe.get(lease_key) != self._router_id.encode():
                return
            state = decode_state(await pipe.hget(route_key, ROLLOUT_FIELD))
            if state is None or not state.running:
                return
            found = await self._following(route, state)
            if found is None:
                return
            following, weights = found
            pipe.multi()
            stage_weights(pipe, route.name, weights, route.targets, following)
            try:
                await pipe.execute()
            except WatchError:
                return  # the operator changed the route meanwhile, or the lease passed on: read again
        await self._acted(route, following)

    async def _following(
        self, route: Route, state: RolloutState
    ) -> tuple[RolloutState, tuple[int, ...]] | None:
        """The state that follows `state` now and the route's weights in it; None while it stays."""
        if state.plan.canary not in route.targets or state.stable != route.targets[0]:
            # The config changed the route's targets under the rollout: it ends, the weights stay.
            return state.moved("aborted", "aborted", TARGETS_CHANGED, reason=TARGETS_CHANGED), route.weights
        following = await self._next_state(route.name, state, time.time())
        return None if following is None else (following, following.weights(route.targets))

    async def _next_state(self, route: str, state: RolloutState, now: float) -> RolloutState | None:
        """The state that follows `state` now; None while it stays as it is."""
        if state.phase == "warming":
            return await self._warming(state, now)
        if now - state.step_started < state.plan.interval_s:
            return None
        plan = state.plan
        windows = await read_window(self._redis, route, state.id, state.window, (state.stable, plan.canary))
        judged = verdict(plan, windows[plan.canary], windows[state.stable], state.baseline)
        if judged.outcome == "wait":
            return None
        return after_check(state, judged, now)

    async def _warming(self, state: RolloutState, now: float) -> RolloutState | None:
        canary = state.plan.canary
        status = await self._status.read_one(canary)
        if status.state == "warm":
            phase: Phase = "holding" if len(state.plan.steps) == 1 else "stepping"
            detail = f"{state.plan.steps[0]} %"
            return state.moved(phase, "step", detail, now, step=0, step_started=now, window=state.window + 1)
        if status.failure is not None:
            reason = f"the canary {canary} failed to load: {status.failure.reason}"
            return state.moved("rolled_back", "rolled_back", reason, now, reason=reason)
        if now - state.started > state.plan.warm_timeout_s:
            reason = f"the canary {canary} was not warm within {state.plan.warm_timeout_s:g} s"
            return state.moved("rolled_back", "rolled_back", reason, now, reason=reason)
        if now - self._load_asked.get(state.id, 0.0) >= LOAD_AGAIN_S:
            await request_model_state(self._redis, canary, "load")
            self._load_asked[state.id] = now
        return None

    async def _acted(self, route: Route, after: RolloutState) -> None:
        """What follows a state written: its event counted and logged; on a rollback, the canary's
        waiting jobs moved to stable."""
        event = after.events[-1]
        ROLLOUT_EVENTS.labels(route.name, event.event).inc()
        details = {"route": route.name, "canary": after.plan.canary, "rollout": after.id}
        if after.phase == "rolled_back":
            logger.warning(f"rollout rolled back: {after.reason}", extra={**details, "reason": after.reason})
            await self._move_waiting(after)
        elif event.event == "check_failed":
            logger.warning(f"rollout check failed: {event.detail}", extra=details)
        else:
            logger.info(f"rollout {event.event} {event.detail}".rstrip(), extra=details)
        if not after.running:
            self._load_asked.pop(after.id, None)

    async def _move_waiting(self, state: RolloutState) -> None:
        try:
            moved = await move_waiting_jobs(self._redis, from_model=state.plan.canary, to_model=state.stable)
        except RedisError as exc:
            logger.warning(
                "could not move the canary's waiting jobs to stable",
                extra={"canary": state.plan.canary, "error": str(exc)},
            )
            return
        if moved:
            logger.info(
                "moved the canary's waiting jobs to stable",
                extra={"canary": state.plan.canary, "stable": state.stable, "jobs": moved},
            )
