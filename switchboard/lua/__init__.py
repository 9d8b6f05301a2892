"""Every Redis script Switchboard runs, one `.lua` file each, with its KEYS and ARGV at its top.

The whole Redis protocol can be audited in this folder: nothing else in the code holds Lua. An owner
registers each script once (`register(redis, "enqueue")`) and calls what it gets back; redis-py runs
it by its SHA and loads it again by itself after a Redis restart. A pipeline that holds scripts
runs them by their SHA through `run_pipeline`, which loads them only when Redis has lost them. The
scripts every request runs go through a `batched.ScriptBatch`: concurrent callers' calls share a
round trip.
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

# A line `--#include <name>` stands for `<name>.lua`'s function: the file without its last line,
# which calls it (`return <name>(KEYS, ARGV)`). One script may so run two others' bodies in one call.
INCLUDE = "--#include "


@cache
def source(name: str) -> str:
    """The text of `<name>.lua` in this folder, its `--#include` lines replaced by what they name."""
    text = resources.files(__package__).joinpath(f"{name}.lua").read_text()
    lines = [
        _included(line.removeprefix(INCLUDE)) if line.startswith(INCLUDE) else line
        for line in text.splitlines()
    ]
    return "\n".join(lines) + "\n"


def _included(name: str) -> str:
    """`<name>.lua` less its last line (the call of its function), for a script that includes it."""
    lines = source(name).rstrip("\n").splitlines()
    if lines[-1] != f"return {name}(KEYS, ARGV)":
        raise ValueError(f"{name}.lua is not written as one function and its call, so it cannot be included")
    return "\n".join(lines[:-1])


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
