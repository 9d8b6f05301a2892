"""Jobs waiting on each model's streams (taken by no worker yet), and how long the oldest has waited.

A model's jobs wait in one stream per tier (`wire.TIERS`): its interactive tiers' jobs are counted
together, its batch lines apart (alone they do not make the model wanted).

One script (`lua/jobs_waiting.lua`) answers for every reader: the worker's controller, the status
page and the front door's metrics. The admission check, which must stay atomic, runs the same count
(`queue_of`) inside its own script. The controller runs it once per model (`add_each_to`), so that no call
touches two models' keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from switchboard import keys, lua
from switchboard.wire import TIERS

# The script's arguments: the workers' group, and the streams of each model (the batch tier's last).
_ARGS: list[str | int] = [keys.JOB_GROUP, len(TIERS)]


@dataclass(frozen=True)
class QueueDepth:
    """One model's queue: interactive jobs no worker has taken, the stream entry id of the oldest
    ('' if none), the jobs its streams hold in all (taken ones and batch lines included: 0 when the
    model has no work), and its batch lines no worker has taken."""

    waiting: int
    oldest_id: str
    length: int = 0
    batch_waiting: int = 0

    def oldest_waiting_s(self, now: float) -> float:
        """Seconds the oldest waiting job has waited at `now` (its entry id is its enqueue time in ms)."""
        if not self.oldest_id:
            return 0.0
        return max(0.0, now - int(self.oldest_id.split("-", 1)[0]) / 1000)


class JobsWaiting:
    """Reads the queues of many models in one script call; registered once by its owner."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._script = lua.register(redis, "jobs_waiting")

    async def add_to(self, pipe: Pipeline, models: Sequence[str]) -> None:
        """Queue the read on `pipe`; `decode_depths` turns its reply into the models' depths."""
        await self._script(keys=_streams(models), args=_ARGS, client=pipe)

    def add_each_to(self, calls: lua.Calls, models: Sequence[str]) -> None:
        """Queue one call per model (run them with a `lua.ScriptRunner`); `decode_each` turns their
        replies into the models' depths."""
        for model in models:
            calls.add(self._script, _streams([model]), _ARGS)

    async def read(self, models: Sequence[str]) -> dict[str, QueueDepth]:
        """Each model's queue depth, in one round trip."""
        return decode_depths(models, await self._script(keys=_streams(models), args=_ARGS))


def decode_depths(models: Sequence[str], reply: Any) -> dict[str, QueueDepth]:
    """The script's reply, by model (in the order of `models`)."""
    return {
        model: QueueDepth(
            waiting=int(waiting), oldest_id=_text(oldest), length=int(length), batch_waiting=int(batch)
        )
        for model, (waiting, oldest, length, batch) in zip(models, reply, strict=True)
    }


def decode_each(models: Sequence[str], replies: Sequence[Any]) -> dict[str, QueueDepth]:
    """The replies of `add_each_to`'s calls, by model (in the order of `models`)."""
    return decode_depths(models, [reply[0] for reply in replies])


def _streams(models: Sequence[str]) -> list[str]:
    return [stream for model in models for stream in keys.job_streams(model, TIERS)]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
