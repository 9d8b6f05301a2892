"""The live workers: those whose heartbeat is fresh, and the records they advertise.

A worker's heartbeat (workers/runtime/heartbeat.py) scores its id in the workers index and writes its
record with a lifetime; it is live while its score is newer than `keys.WORKER_TTL_S` and its record
has not expired. The front door's status, readiness and admission, the controllers' view of the
other workers and the takeover of dead workers' jobs all read them here, so they agree on who is
alive.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import cast

import msgspec
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from switchboard import keys
from switchboard.wire import WorkerRecord, worker_decoder

logger = logging.getLogger(__name__)


def add_ids_read_to(pipe: Pipeline, now: float) -> None:
    """Queue the read of the live workers' ids on `pipe`; `read_records` reads their records."""
    pipe.zrangebyscore(keys.workers_index(), now - keys.WORKER_TTL_S, "+inf")


async def read_live(redis: aioredis.Redis, *, besides: str = "") -> list[WorkerRecord]:
    """The live workers' records, but the one of the worker `besides` (a worker's own id)."""
    since = time.time() - keys.WORKER_TTL_S
    worker_ids = cast(list[bytes], await redis.zrangebyscore(keys.workers_index(), since, "+inf"))
    return await read_records(redis, [w for w in worker_ids if w.decode() != besides])


async def alive_among(redis: aioredis.Redis, worker_ids: Sequence[str]) -> set[str]:
    """Those of `worker_ids` alive, in one round trip: their record has not expired (it outlives
    their last beat by `keys.WORKER_TTL_S`, as their index score counts)."""
    pipe = redis.pipeline(transaction=False)
    for worker_id in worker_ids:
        pipe.exists(keys.worker_record(worker_id))
    return {worker_id for worker_id, exists in zip(worker_ids, await pipe.execute(), strict=True) if exists}


async def read_records(redis: aioredis.Redis, worker_ids: Sequence[bytes]) -> list[WorkerRecord]:
    """The records of `worker_ids` (read from the index), in one round trip; a record expired since
    the index was read belongs to a worker no longer alive, and an unreadable one is logged."""
    if not worker_ids:
        return []
    payloads = await redis.mget([keys.worker_record(w.decode()) for w in worker_ids])
    records = []
    for payload in payloads:
        if not isinstance(payload, bytes):
            continue
        try:
            records.append(worker_decoder.decode(payload))
        except msgspec.DecodeError:
            logger.warning("unreadable worker record", extra={"payload_bytes": len(payload)})
    return records
