"""Cancel marks: how a front door (or a worker, for a front door that died) stops a job's generation.

A mark is left only for a job that has not ended: the worker's last chunk of a job marks its record
`done` (`keys.job_record`), and a mark left after that, by a client that went away just as its
answer ended, would only linger until it expired, for nobody.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from switchboard import keys, lua


class CancelMarks:
    """Leaves cancel marks for jobs that have not ended."""

    def __init__(self, redis: aioredis.Redis) -> None:
        # Registered once: later calls send only the script's hash (EVALSHA), loading it on a miss.
        self._script = lua.register(redis, "cancel")

    async def leave(self, job_id: str, client: Any = None) -> None:
        """Leave the job's cancel mark, unless the job has ended; `client`: a pipeline to queue it on."""
        await self._script(
            keys=[keys.cancel_mark(job_id), keys.job_record(job_id)],
            args=[keys.CANCEL_TTL_S, keys.DONE_FIELD],
            client=client,
        )
