"""Every Redis script Switchboard runs, one `.lua` file each, with its KEYS and ARGV at its top.

The whole Redis protocol can be audited in this folder: nothing else in the code holds Lua. An owner
registers each script once (`register(redis, "enqueue")`) and calls what it gets back; redis-py runs
it by its SHA and loads it again by itself after a Redis restart. A pipeline that holds scripts
runs them by their SHA through a `ScriptRunner`, the one place that loads them again when Redis has
lost them. The scripts every request runs go through a `batched.ScriptBatch`: concurrent callers'
calls share a round trip.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
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


class Calls:
    """The commands of one pipeline: script calls by their SHA alone (`add`), any other on `pipe`."""

    def __init__(self, pipe: Pipeline) -> None:
        self.pipe = pipe
        # Each script call by its position among the pipeline's commands, to be sent again if lost.
        self.scripts: dict[int, tuple[AsyncScript, Sequence[Any], Sequence[Any]]] = {}

    def add(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> None:
        """Queue a call of `script` with these KEYS and ARGV."""
        self.scripts[len(self.pipe)] = (script, keys, args)
        self.pipe.evalsha(script.sha, len(keys), *keys, *args)


class ScriptRunner:
    """Runs pipelines of script calls for one owner, each script loaded before its first call.

    A pipeline of registered scripts would ask Redis whether it has them before every run, a round
    trip more; here each call goes by its SHA alone. A call that Redis answers NOSCRIPT (it restarted
    and lost its scripts) did not run: its script is loaded and that call alone is sent again, once.
    Nothing else is ever sent twice.
    """

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        # The scripts Redis is known to hold.
        self._loaded: set[str] = set()

    async def run(
        self, fill: Callable[[Calls], None], *, transaction: bool = False, raise_on_error: bool = True
    ) -> list[Any]:
        """The replies of the pipeline `fill` queues, in order: one round trip while Redis holds the
        scripts. `transaction`: run it as MULTI/EXEC. `raise_on_error`: raise the first error, else
        leave each in place of its reply."""
        calls = Calls(self._redis.pipeline(transaction=transaction))
        fill(calls)
        await self._load(script for script, _, _ in calls.scripts.values())
        replies = await calls.pipe.execute(raise_on_error=False)
        lost = [at for at in calls.scripts if isinstance(replies[at], NoScriptError)]
        if lost:
            replies = await self._send_again(calls, lost, replies, transaction)
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies

    async def _send_again(
        self, calls: Calls, lost: list[int], replies: list[Any], transaction: bool
    ) -> list[Any]:
        """`replies` with the lost calls' replies in their places, those calls sent again once loaded."""
        self._loaded.difference_update(calls.scripts[at][0].sha for at in lost)
        await self._load(calls.scripts[at][0] for at in lost)
        again = self._redis.pipeline(transaction=transaction)
        for at in lost:
            script, keys, args = calls.scripts[at]
            again.evalsha(script.sha, len(keys), *keys, *args)
        replies = list(replies)
        for at, reply in zip(lost, await again.execute(raise_on_error=False), strict=True):
            replies[at] = reply
        return replies

    async def _load(self, scripts: Iterable[AsyncScript]) -> None:
        for script in {script.sha: script for script in scripts}.values():
            if script.sha not in self._loaded:
                await self._redis.script_load(script.script)
                self._loaded.add(script.sha)
