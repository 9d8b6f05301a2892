"""Every Redis script Switchboard runs, one `.lua` file each, with its KEYS and ARGV at its top.

The whole Redis protocol can be audited in this folder: nothing else in the code holds Lua. An owner
registers each script once (`register(redis, "enqueue")`) and calls what it gets back; redis-py runs
it by its SHA and loads it again by itself after a Redis restart.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript


@cache
def source(name: str) -> str:
    """The text of `<name>.lua` in this folder."""
    return resources.files(__package__).joinpath(f"{name}.lua").read_text()


def register(redis: aioredis.Redis, name: str) -> AsyncScript:
    """The script `<name>.lua`, registered on `redis` (no round trip until its first call)."""
    return redis.register_script(source(name))
