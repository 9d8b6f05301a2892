"""Move the jobs that wait on one model's streams to another model's (a route rolled its canary back),
or on one of its tiers to another (a batch whose window would not hold moves up).

No worker has taken a moved job: the jobs after the workers' group's last delivered entry are taken
from the first model's stream in one script (`switchboard/lua/take_waiting.lua`, which Redis runs
between two reads of the workers, never during one), then queued on the second model's stream as
they were, keeping their id, record and deadline. Their clients go on reading the same results;
the worker that serves them says which model it was.

The two steps touch one model's keys each (keys of two models never meet in one script, so a
Redis Cluster can hold them apart). A front door that dies between them loses the jobs it took:
their clients get the deadline's 504, as for any job lost with Redis.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec
import redis.asyncio as aioredis

from router.queue.enqueue import JobQueue
from switchboard import keys, lua
from switchboard.tasks import TaskSet
from switchboard.wire import TIERS, Job, job_decoder

logger = logging.getLogger(__name__)

# Taken in batches, so that one script never holds Redis long however long the queue.
BATCH = 200


async def move_waiting_jobs(redis: aioredis.Redis, from_model: str, to_model: str) -> int:
    """Queue on `to_model` every job waiting on `from_model` that no worker has taken, each in the
    tier it waited in; how many moved."""
    moved = 0
    for tier in TIERS:
        moved += await requeue_waiting(
            redis, keys.job_stream(from_model, tier), lambda job: msgspec.structs.replace(job, model=to_model)
        )
    if moved:
        logger.info("moved waiting jobs", extra={"model": from_model, "to": to_model, "jobs": moved})
    return moved


async def requeue_waiting(redis: aioredis.Redis, stream: str, change: Callable[[Job], Job]) -> int:
    """Queue again, as `change` makes them, the jobs waiting on `stream` that no worker has taken
    (to another model's stream, or to another tier's); how many."""
    take = lua.register(redis, "take_waiting")
    queue = JobQueue(redis, TaskSet("job move"))
    moved = 0
    while True:
        taken = await take(keys=[stream], args=[keys.JOB_GROUP, BATCH])
        for payload in taken:
            # Its record keeps the key that sent it: a moved job's owner is not written again.
            await queue.submit(change(job_decoder.decode(payload)), owner="", moved=True)
            moved += 1
        if len(taken) < BATCH:
            return moved
