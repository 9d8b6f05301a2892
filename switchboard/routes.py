"""Model routes: a configured name that resolves to one of its target models by weight.

A route is routing state only; its targets are ordinary configured models. The config gives a
route's targets, in a fixed order (stable first), and its first weights; the live weights are in
Redis, one hash per route (`keys.route`), so that every front door applies the same ones and an
operator changes them without a restart:

- `weights`: JSON object, target → integer percent, in the targets' fixed order, summing to 100;
- `version`: a counter bumped by every change of the record;
- `updated`: unix seconds of the last change;
- `rollout`: the last progressive rollout's state (`switchboard.rollout`), JSON; absent before the first.

Every write also replaces `keys.routes_version`, the one key front doors poll to notice a change:
with a random token rather than a count, which a Redis that lost its data and counted again from
zero could bring back to the value a front door last saw.

A caller is placed by a bucket in [0, BUCKETS) hashed from the route's name and the caller's
stickiness key; the targets take cumulative ranges of the buckets in their fixed order. Raising
the last target's weight (the canary's) at the expense of the first (the stable one) therefore
only moves callers from stable to canary, never back.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import WatchError

from switchboard import keys
from switchboard.rollout import RolloutPlan, RolloutState, decode_state, encode_state, new_rollout

# A bucket is a hundredth of a percent: weights are whole percents, and 10,000 buckets spread the
# callers of a 1 % canary over 100 of them.
BUCKETS = 10_000
PERCENT = 100
WEIGHT_FIELD = "weights"
VERSION_FIELD = "version"
UPDATED_FIELD = "updated"
ROLLOUT_FIELD = "rollout"
# Tries of an operator's rollout write whose route changed under its WATCH: enough for the writes a
# route sees at once (seeding, the judge's step); one that changes this often is a conflict to report.
WATCH_ATTEMPTS = 5

_weights_json = msgspec.json.Decoder(dict[str, int])


class WeightsError(ValueError):
    """Weights a route cannot take; the message says why."""


class RolloutConflict(Exception):
    """A rollout cannot start (one runs) or stop (none runs); the message says which."""


class Route(msgspec.Struct, frozen=True, kw_only=True):
    """A route's targets in their fixed order, each with its weight (percent), and its version."""

    name: str
    targets: tuple[str, ...]
    weights: tuple[int, ...]
    version: int = 0
    updated: float | None = None
    # The route's last rollout (running or ended), if it had one.
    rollout: RolloutState | None = None

    def weight_map(self) -> dict[str, int]:
        """Target → weight, in the targets' fixed order."""
        return dict(zip(self.targets, self.weights, strict=True))

    def target_for(self, stickiness_key: str) -> str:
        """The target that serves the caller with `stickiness_key`."""
        return pick_target(self.targets, self.weights, bucket(self.name, stickiness_key))


def bucket(route: str, stickiness_key: str) -> int:
    """The caller's bucket on `route`, in [0, BUCKETS): the same for the same route and key, anywhere."""
    digest = hashlib.sha256(f"{route}\0{stickiness_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def pick_target(targets: Sequence[str], weights: Sequence[int], at: int) -> str:
    """The target whose cumulative range of buckets holds bucket `at` (weights in percent)."""
    upper = 0
    for target, weight in zip(targets, weights, strict=True):
        upper += weight * (BUCKETS // PERCENT)
        if at < upper:
            return target
    raise ValueError(f"bucket {at} is outside [0, {BUCKETS}) or the weights do not sum to 100")


def checked_weights(targets: Sequence[str], weights: Mapping[str, object]) -> tuple[int, ...]:
    """`weights` in the targets' fixed order: each target named once, whole percents summing to 100."""
    unknown = sorted(set(weights) - set(targets))
    if unknown:
        raise WeightsError(
            f"not targets of this route: {', '.join(unknown)}; its targets are {', '.join(targets)}"
        )
    missing = [target for target in targets if target not in weights]
    if missing:
        raise WeightsError(f"every target needs a weight; missing: {', '.join(missing)}")
    ordered: list[int] = []
    for target in targets:
        weight = weights[target]
        if isinstance(weight, bool) or not isinstance(weight, int) or not 0 <= weight <= PERCENT:
            raise WeightsError(
                f"the weight of {target} must be a whole percent from 0 to 100, not {weight!r}"
            )
        ordered.append(weight)
    if sum(ordered) != PERCENT:
        raise WeightsError(f"weights must sum to 100, not {sum(ordered)}")
    return tuple(ordered)


async def seed_route(redis: aioredis.Redis, route: Route) -> bool:
    """Give Redis `route`'s configured weights unless it holds live ones for the same targets;
    whether anything was written.

    Live weights are kept across restarts of every front door; weights for other targets (the
    config changed the route's targets) are replaced by the config's."""
    fields = await redis.hgetall(keys.route(route.name))  # type: ignore[misc]
    if route_from_fields(route.name, route.targets, fields) is not None:
        return False
    if WEIGHT_FIELD.encode() in fields:
        await write_weights(redis, route.name, route.weights, route.targets)
        return True
    # Only one of the front doors starting at once writes the first weights (nor does a front
    # door's seeding undo an operator's change made meanwhile).
    if not await redis.hsetnx(keys.route(route.name), WEIGHT_FIELD, _encoded(route.targets, route.weights)):  # type: ignore[misc]
        return False
    pipe = redis.pipeline(transaction=True)
    pipe.hset(keys.route(route.name), UPDATED_FIELD, repr(time.time()))
    pipe.hincrby(keys.route(route.name), VERSION_FIELD, 1)
    _mark_changed(pipe)
    await pipe.execute()
    return True


def route_from_fields(name: str, targets: Sequence[str], fields: Mapping[Any, Any]) -> Route | None:
    """The route that a `keys.route` hash holds, if it holds weights for exactly `targets`."""
    raw = fields.get(WEIGHT_FIELD.encode())
    if raw is None:
        return None
    try:
        weights = checked_weights(targets, _weights_json.decode(raw))
    except (msgspec.DecodeError, msgspec.ValidationError, WeightsError):
        return None
    version = int(fields.get(VERSION_FIELD.encode(), b"0"))
    updated = float(fields.get(UPDATED_FIELD.encode(), b"0")) or None
    rollout = decode_state(fields.get(ROLLOUT_FIELD.encode()))
    return Route(
        name=name, targets=tuple(targets), weights=weights, version=version, updated=updated, rollout=rollout
    )


async def write_weights(
    redis: aioredis.Redis,
    name: str,
    weights: Sequence[int],
    targets: Sequence[str],
    rollout: RolloutState | None = None,
) -> None:
    """Store new weights for route `name` (and its rollout's state, if given), bump its version and
    the routes' version, in one transaction."""
    pipe = redis.pipeline(transaction=True)
    stage_weights(pipe, name, weights, targets, rollout)
    await pipe.execute()


def stage_weights(
    pipe: Any, name: str, weights: Sequence[int], targets: Sequence[str], rollout: RolloutState | None = None
) -> None:
    """Queue on `pipe` (in MULTI) the writes of `write_weights`: for writers that WATCH keys first."""
    fields = {WEIGHT_FIELD: _encoded(targets, weights), UPDATED_FIELD: repr(time.time())}
    if rollout is not None:
        fields[ROLLOUT_FIELD] = encode_state(rollout)
    pipe.hset(keys.route(name), mapping=fields)
    pipe.hincrby(keys.route(name), VERSION_FIELD, 1)
    _mark_changed(pipe)


async def start_rollout(redis: aioredis.Redis, route: Route, plan: RolloutPlan) -> RolloutState:
    """Start rolling out `plan` (checked) on `route`: warming first, its canary at weight 0.
    RolloutConflict while one runs (or the route changed as it started)."""
    state = new_rollout(plan, stable=route.targets[0])
    return await _replace_rollout(redis, route, lambda current: _starting(current, state))


async def abort_rollout(redis: aioredis.Redis, route: Route, reason: str) -> RolloutState:
    """End the rollout running on `route` at once, its canary back to weight 0 (stable the rest).
    RolloutConflict when none runs."""
    return await _replace_rollout(redis, route, lambda current: _aborted(current, reason))


def _starting(current: RolloutState | None, state: RolloutState) -> RolloutState:
    if current is not None and current.running:
        raise RolloutConflict(f"a rollout of {current.plan.canary} runs ({current.phase}); abort it first")
    return state


def _aborted(current: RolloutState | None, reason: str) -> RolloutState:
    if current is None or not current.running:
        raise RolloutConflict("no rollout runs on this route")
    return current.moved("aborted", "aborted", reason, reason=reason)


async def _replace_rollout(redis: aioredis.Redis, route: Route, change: Any) -> RolloutState:
    """Write the state `change` makes of the route's current rollout, with its weights, if the
    route's hash did not change meanwhile (WATCH); read again and retry when it did.

    The hash changes under an operator's request for reasons of no concern to it (a front door
    seeding the route as it starts, the judge stepping the weights): `change` is made again from
    what the hash holds then, so a real conflict (a rollout started meanwhile) still raises."""
    key = keys.route(route.name)
    for _ in range(WATCH_ATTEMPTS):
        async with redis.pipeline(transaction=True) as pipe:
            await pipe.watch(key)
            state: RolloutState = change(decode_state(await pipe.hget(key, ROLLOUT_FIELD)))
            pipe.multi()
            stage_weights(pipe, route.name, state.weights(route.targets), route.targets, state)
            try:
                await pipe.execute()
            except WatchError:
                continue
        return state
    raise RolloutConflict("the route kept changing meanwhile; try again")


def _encoded(targets: Sequence[str], weights: Sequence[int]) -> bytes:
    return msgspec.json.encode(dict(zip(targets, weights, strict=True)))


def _mark_changed(pipe: Any) -> None:
    pipe.set(keys.routes_version(), uuid.uuid4().hex)
