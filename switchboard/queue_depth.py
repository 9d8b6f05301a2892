"""Jobs waiting on each model's stream (taken by no worker yet), and how long the oldest has waited.

One script (`lua/jobs_waiting.lua`) answers for every reader: the worker's controller, the status
page and the front door's metrics. The admission check counts the same way inside its own script,
which must stay atomic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from switchboard import keys, lua


@dataclass(frozen=True)
class QueueDepth:
    """One model's queue: jobs no worker has taken, and the stream entry id of the oldest ('' if none)."""

    waiting: int
    oldest_id: str

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
        await self._script(keys=_streams(models), args=[keys.JOB_GROUP], client=pipe)

    async def read(self, models: Sequence[str]) -> dict[str, QueueDepth]:
        """Each model's queue depth, in one round trip."""
        return decode_depths(models, await self._script(keys=_streams(models), args=[keys.JOB_GROUP]))


def decode_depths(models: Sequence[str], reply: Any) -> dict[str, QueueDepth]:
    """The script's reply, by model (in the order of `models`)."""
    return {
        model: QueueDepth(waiting=int(waiting), oldest_id=_text(oldest))
        for model, (waiting, oldest) in zip(models, reply, strict=True)
    }


def _streams(models: Sequence[str]) -> list[str]:
    return [keys.job_stream(model) for model in models]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
