"""The demand poke: one entry on the demand stream wakes every worker's controller at once.

The front door's admin requests and a worker's controller poke through `poke_demand`; the enqueue
script (`lua/enqueue.lua`) adds the same entry inside its own atomic step.
"""

from __future__ import annotations

from redis.asyncio.client import Pipeline

from switchboard import keys


def poke_demand(pipe: Pipeline, model: str = "") -> None:
    """Add a poke about `model` ("" for any) to `pipe`, and renew the demand stream's lifetime."""
    pipe.xadd(keys.demand_stream(), {keys.MODEL_FIELD: model}, maxlen=keys.DEMAND_MAXLEN, approximate=True)
    pipe.expire(keys.demand_stream(), keys.DEMAND_TTL_S)
