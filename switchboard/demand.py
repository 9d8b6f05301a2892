"""Demand: which models have work (the demand index), and the poke that wakes the controllers.

The index (`keys.demand_index`) maps each model with work to the token of the last enqueue or
operator's load request that noted it. Controllers read the queues of these models (and of those
they hold), nothing else, so what a pass costs follows what is active, not what is configured. The
rule it keeps: a model whose job stream holds any job is in the index.

- An enqueue notes the model after appending the job, in the same script (`lua/enqueue.lua`, under
  the job's id); an operator's load request notes it too (`note_demand`). Each note writes a token
  of its own.
- A job put back in line is appended before its old entry is deleted, in one script: its stream
  never looks empty meanwhile, so its model stays in the index.
- A controller that finds a model's stream empty (and no operator's load request for it) removes
  the entry only if its token is still the one it read before it looked at the stream
  (`DemandIndex.forget`). An enqueue that raced with it wrote a new token after its job, and so
  either keeps the entry or adds it again.

A poke is one entry on the demand stream naming its model ("" for any); a controller whose worker
could never hold that model does not pass for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from switchboard import keys, lua


def poke_demand(pipe: Pipeline, model: str = "") -> None:
    """Add a poke about `model` ("" for any) to `pipe`, and renew the demand stream's lifetime."""
    pipe.xadd(keys.demand_stream(), {keys.MODEL_FIELD: model}, maxlen=keys.DEMAND_MAXLEN, approximate=True)
    pipe.expire(keys.demand_stream(), keys.DEMAND_TTL_S)


def note_demand(pipe: Pipeline, model: str, token: str) -> None:
    """Add to `pipe`: `model` has work (noted under `token`, unique to this note), and a poke about it.

    Queue it after what gave the model work (the job's append), never before.
    """
    pipe.hset(keys.demand_index(), model, token)
    pipe.expire(keys.demand_index(), keys.DEMAND_INDEX_TTL_S)
    poke_demand(pipe, model)


class DemandIndex:
    """A controller's side of the demand index: read it, forget the models found without work."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._forget = lua.register(redis, "forget_demand")

    def add_read_to(self, pipe: Pipeline) -> None:
        """Queue the read of the index on `pipe`; `decode` turns its reply into model → token."""
        pipe.hgetall(keys.demand_index())

    @staticmethod
    def decode(reply: dict[bytes, bytes]) -> dict[str, bytes]:
        """The index as read: model name → the token of its last note."""
        return {name.decode(): token for name, token in reply.items()}

    async def read(self) -> dict[str, bytes]:
        """The models with work, each with the token of its last note."""
        return self.decode(cast(dict[bytes, bytes], await self._redis.hgetall(keys.demand_index())))  # type: ignore[misc]

    async def forget(self, read: Sequence[tuple[str, bytes]]) -> int:
        """Remove each (model, token) whose token is still the one read; returns how many went."""
        if not read:
            return 0
        args = [part for model, token in read for part in (model, token)]
        return int(await self._forget(keys=[keys.demand_index()], args=args))
