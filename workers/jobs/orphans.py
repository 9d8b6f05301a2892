"""Running jobs nobody reads any more: the worker stops generating them.

A job's cancel mark (its client left) is seen by the next chunk written for it; a job still
waiting in the engine's queue writes none, so the watch looks for the marks of the jobs running
here every CHECK_S and aborts the marked ones in the engine.

Jobs whose front door died: every front door refreshes `keys.router_alive(id)` while it runs, and every job names the front
door waiting for it (`Job.router_id`). A job running here whose front door has been gone for
ORPHAN_GRACE_S, and whose stream no client resumed elsewhere (`resumes` in `keys.job_record`), gets its cancel
mark, as its front door would have left one, and is aborted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from switchboard import keys
from switchboard.cancel_marks import CancelMarks
from switchboard.tasks import poll
from switchboard.wire import Job

logger = logging.getLogger(__name__)

# How often the cancel marks and the front doors of running jobs are checked: one round trip.
CHECK_S = 0.5
# How long a front door stays gone before its jobs are cancelled: time for its clients to resume
# their streams through another front door (`Last-Event-ID`). The default of `worker.orphan_grace_s`.
ORPHAN_GRACE_S = 5.0


Abort = Callable[[], Awaitable[None]]


class OrphanWatch:
    """Aborts the jobs running here that have a cancel mark; cancels those whose front door is gone
    and whose client did not come back."""

    def __init__(self, redis: aioredis.Redis, *, grace_s: float = ORPHAN_GRACE_S) -> None:
        self._redis = redis
        self._cancel_marks = CancelMarks(redis)
        self._grace_s = grace_s
        self._front_door_of: dict[str, str] = {}
        self._gone_since: dict[str, float] = {}
        self._aborts: dict[str, Abort] = {}

    def track(self, job: Job, abort: Abort | None = None) -> None:
        """Watch `job` while it runs here; `abort` stops it in the engine once it has a cancel mark.
        (Jobs from front doors without a heartbeat are watched for marks only.)"""
        if job.router_id is not None:
            self._front_door_of[job.id] = job.router_id
        if abort is not None:
            self._aborts[job.id] = abort

    def untrack(self, job_id: str) -> None:
        self._front_door_of.pop(job_id, None)
        self._aborts.pop(job_id, None)

    async def run(self, every_s: float = CHECK_S) -> None:
        """Check every `every_s` until cancelled; a failed check is logged and tried again."""
        await poll(self.check, every_s, "check the front doors of running jobs", log=logger)

    async def check(self) -> list[str]:
        """Cancel the orphans among the running jobs, then abort every marked one; the orphans' ids."""
        orphans = await self._cancel_orphans()
        await self._abort_marked()
        return orphans

    async def _abort_marked(self) -> None:
        watched = list(self._aborts)
        if not watched:
            return
        pipe = self._redis.pipeline(transaction=False)
        for job_id in watched:
            pipe.exists(keys.cancel_mark(job_id))
        marked = await pipe.execute()
        for job_id, mark in zip(watched, marked, strict=True):
            abort = self._aborts.pop(job_id, None) if mark else None
            if abort is not None:
                logger.info("job aborted: its client left", extra={"job_id": job_id})
                await abort()

    async def _cancel_orphans(self) -> list[str]:
        gone = await self._front_doors_gone_long_enough()
        candidates = [job for job, router in self._front_door_of.items() if router in gone]
        if not candidates:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for job_id in candidates:
            pipe.hexists(keys.job_record(job_id), keys.RESUMES_FIELD)
        resumed = await pipe.execute()
        orphans = [job_id for job_id, again in zip(candidates, resumed, strict=True) if not again]
        if orphans:
            pipe = self._redis.pipeline(transaction=False)
            for job_id in orphans:
                await self._cancel_marks.leave(job_id, client=pipe)
            await pipe.execute()
            for job_id in orphans:
                del self._front_door_of[job_id]  # marked once; its abort follows
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
