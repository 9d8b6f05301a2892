"""Every Redis script Switchboard runs, one `.lua` file each, with its KEYS and ARGV at its top.

The whole Redis protocol can be audited in this folder: nothing else in the code holds Lua. An owner
registers each script once (`register(redis, "enqueue")`) and calls what it gets back; redis-py runs
it by its SHA and loads it again by itself after a Redis restart. A pipeline that holds scripts
runs them by their SHA through `run_pipeline`, which loads them only when Redis has lost them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError


@cache
def source(name: str) -> str:
    """The text of `<name>.lua` in this folder."""
    return resources.files(__package__).joinpath(f"{name}.lua").read_text()


def register(redis: aioredis.Redis, name: str) -> AsyncScript:
    """The script `<name>.lua`, registered on `redis` (no round trip until its first call)."""
    return redis.register_script(source(name))


def add_script(pipe: Pipeline, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]) -> None:
    """Queue `script` on `pipe` by its SHA alone (for `run_pipeline`, which loads it when missing)."""
    pipe.evalsha(script.sha, len(keys), *keys, *args)


async def run_pipeline(
    redis: aioredis.Redis, fill: Callable[[Pipeline], None], scripts: Sequence[AsyncScript]
) -> list[Any]:
    """Run the pipeline `fill` queues, whose `scripts` it adds with `add_script`: one round trip.

    A pipeline of registered scripts would ask Redis whether it has them before every run, a round
    trip more. Here a Redis that has lost them (it restarted) answers NOSCRIPT: they are loaded and
    the whole pipeline runs once more, so `fill` must queue only what may run twice.
    """
    for attempt in range(2):
        pipe = redis.pipeline(transaction=False)
        fill(pipe)
        replies = await pipe.execute(raise_on_error=False)
        if attempt == 0 and any(isinstance(reply, NoScriptError) for reply in replies):
            for script in scripts:
                await redis.script_load(script.script)
            continue
        break
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies
