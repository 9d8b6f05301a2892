"""Asking the workers' model controllers to load or unload a model, or to fetch a remote model's files
into every node cache ahead of its loads: a desired state in Redis.

The front door never calls a worker. A request is a desired state that the controllers read: it
bumps the catalogue version (controllers read desired states again when it moved) and pokes them,
so that they act at once rather than on their next tick; a load request also notes the model in the
demand index, so that workers that do not hold it look at it. `POST /admin/models/{name}/load` and a
rollout warming its canary (`router.routing.rollouts.judge`) ask this way.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

import redis.asyncio as aioredis

from switchboard import keys
from switchboard.catalogue import bump_catalogue
from switchboard.demand import note_demand, poke_demand
from switchboard.wire import DesiredState, encode


async def request_prefetch(redis: aioredis.Redis, name: str) -> None:
    """Ask every worker that may hold remote model `name` to fetch its files into its node cache."""
    desired = DesiredState(action="prefetch", at=time.time())
    pipe = redis.pipeline(transaction=False)
    pipe.set(keys.prefetch_request(name), encode(desired), ex=keys.PREFETCH_TTL_S)
    bump_catalogue(pipe)
    note_demand(pipe, name, uuid.uuid4().hex)  # weighed by every worker that may hold it
    await pipe.execute()


async def request_model_state(redis: aioredis.Redis, name: str, action: Literal["load", "unload"]) -> None:
    """Ask the workers to load or unload model `name`."""
    desired = DesiredState(action=action, at=time.time())
    pipe = redis.pipeline(transaction=False)
    pipe.set(keys.desired_state(name), encode(desired), ex=keys.DESIRED_TTL_S)
    # In this order: a controller that reads the demand index, then the version, sees the request.
    bump_catalogue(pipe)
    if action == "load":
        note_demand(pipe, name, uuid.uuid4().hex)  # weighed by every worker that may hold it
    else:
        poke_demand(pipe, name)  # only its holders act, and they weigh what they hold
    await pipe.execute()
