"""Jobs whose front door died: nobody will read their answer, so the worker stops generating them.

Every front door refreshes `keys.router_alive(id)` while it runs, and every job names the front
door waiting for it (`Job.router_id`). A job running here whose front door has been gone for
ORPHAN_GRACE_S, and whose stream no client resumed elsewhere (`resumes` in `keys.job_record`), gets its cancel
mark, as its front door would have left one: the next chunk written for it aborts it in the engine.
"""

from __future__ import annotations

import asyncio
import logging
import time

import redis.asyncio as aioredis

from switchboard import keys
from switchboard.cancel_marks import CancelMarks
from switchboard.wire import Job

logger = logging.getLogger(__name__)

# How often the front doors of running jobs are checked.
CHECK_S = keys.ROUTER_HEARTBEAT_S
# How long a front door stays gone before its jobs are cancelled: time for its clients to resume
# their streams through another front door (`Last-Event-ID`). The default of `worker.orphan_grace_s`.
ORPHAN_GRACE_S = 5.0


class OrphanWatch:
    """Cancels the jobs running here whose front door is gone and whose client did not come back."""

    def __init__(self, redis: aioredis.Redis, *, grace_s: float = ORPHAN_GRACE_S) -> None:
        self._redis = redis
        self._cancel_marks = CancelMarks(redis)
        self._grace_s = grace_s
        self._front_door_of: dict[str, str] = {}
        self._gone_since: dict[str, float] = {}

    def track(self, job: Job) -> None:
        """Watch `job` while it runs here (jobs from front doors without a heartbeat are not)."""
        if job.router_id is not None:
            self._front_door_of[job.id] = job.router_id

    def untrack(self, job_id: str) -> None:
        self._front_door_of.pop(job_id, None)

    async def run(self, every_s: float = CHECK_S) -> None:
        """Check every `every_s` until cancelled; a failed check is logged and tried again."""
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.check()
            except Exception:
                logger.warning("could not check the front doors of running jobs", exc_info=True)

    async def check(self) -> list[str]:
        """Cancel the orphans among the running jobs; their ids."""
        gone = await self._front_doors_gone_long_enough()
        candidates = [job for job, router in self._front_door_of.items() if router in gone]
        if not candidates:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for job_id in candidates:
            pipe.hexists(keys.job_record(job_id), "resumes")
        resumed = await pipe.execute()
        orphans = [job_id for job_id, again in zip(candidates, resumed, strict=True) if not again]
        if orphans:
            pipe = self._redis.pipeline(transaction=False)
            for job_id in orphans:
                await self._cancel_marks.leave(job_id, client=pipe)
            await pipe.execute()
            logger.info("cancelled jobs whose front door is gone", extra={"job_ids": orphans})
        return orphans

    async def _front_doors_gone_long_enough(self) -> set[str]:
        routers = sorted(set(self._front_door_of.values()))
        if not routers:
            self._gone_since.clear()
            return set()
        pipe = self._redis.pipeline(transaction=False)
        for router in routers:
            pipe.exists(keys.router_alive(router))
        alive = await pipe.execute()
        now = time.monotonic()
        gone_now = {router for router, up in zip(routers, alive, strict=True) if not up}
        self._gone_since = {router: self._gone_since.get(router, now) for router in gone_now}
        return {router for router, since in self._gone_since.items() if now - since >= self._grace_s}
