"""The records of batches in Redis: who created each, its input, its status and times, its counts,
and the lines it has finished.

A batch belongs to the key that created it, by the key's identity (as its files do): any other key
reads, lists and cancels none of it. Its finished lines (`keys.batch_results`) are its durable
progress: each is written as soon as it ends, so a runner that takes a batch over (the front door
that ran it died) runs only the lines that have not ended, and none twice.
"""

from __future__ import annotations

import secrets
from typing import Any, cast

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import WatchError

from router.openai.batches import BatchError, BatchErrors, BatchObject, BatchStatus, RequestCounts
from router.openai.errors import OpenAIError
from switchboard import keys

ID_PREFIX = "batch_"
_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
ACTIVE: tuple[BatchStatus, ...] = ("validating", "in_progress", "cancelling", "finalizing")


class NoSuchBatchError(OpenAIError):
    """A batch that does not exist, or that another key created (404 either way)."""

    status_code = 404
    error_type = "invalid_request_error"
    default_code = "batch_not_found"

    def __init__(self, batch_id: str) -> None:
        super().__init__(f"No batch found with id '{batch_id}'.", param="batch_id")


class BatchRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    owner: str
    input_file_id: str
    endpoint: str
    status: BatchStatus
    created_at: float
    expires_at: float
    metadata: dict[str, str] | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    errors: tuple[BatchError, ...] = ()
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: float | None = None
    finalizing_at: float | None = None
    completed_at: float | None = None
    failed_at: float | None = None
    expired_at: float | None = None
    cancelling_at: float | None = None
    cancelled_at: float | None = None

    def as_openai(self) -> BatchObject:
        return BatchObject(
            id=self.id,
            endpoint=self.endpoint,
            input_file_id=self.input_file_id,
            completion_window="24h",
            status=self.status,
            created_at=int(self.created_at),
            expires_at=int(self.expires_at),
            request_counts=RequestCounts(total=self.total, completed=self.completed, failed=self.failed),
            errors=BatchErrors(data=list(self.errors)) if self.errors else None,
            output_file_id=self.output_file_id,
            error_file_id=self.error_file_id,
            in_progress_at=_seconds(self.in_progress_at),
            finalizing_at=_seconds(self.finalizing_at),
            completed_at=_seconds(self.completed_at),
            failed_at=_seconds(self.failed_at),
            expired_at=_seconds(self.expired_at),
            cancelling_at=_seconds(self.cancelling_at),
            cancelled_at=_seconds(self.cancelled_at),
            metadata=self.metadata,
        )


class LineResult(msgspec.Struct, frozen=True, kw_only=True):
    """One finished line: answered (its output line) or failed (its error line), as JSON text."""

    ok: bool
    line: bytes


def _seconds(at: float | None) -> int | None:
    return None if at is None else int(at)


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(BatchRecord)
_result_decoder = msgspec.msgpack.Decoder(LineResult)


def new_batch_id() -> str:
    return ID_PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(24))


class BatchRecords:
    """Every front door's view of the batches."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    async def add(self, record: BatchRecord) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(keys.batch_record(record.id), _encoder.encode(record))
            pipe.zadd(keys.batches_of(record.owner), {record.id: record.created_at})
            pipe.zadd(keys.batches_active(), {record.id: record.created_at})
            await pipe.execute()

    async def save(self, record: BatchRecord) -> None:
        """Write `record` as it stands now; an ended batch leaves the active set, and its record and
        results expire BATCH_KEPT_S later."""
        async with self._redis.pipeline(transaction=True) as pipe:
            self._queue_save(pipe, record)
            await pipe.execute()

    async def save_if(self, record: BatchRecord, expected: BatchStatus) -> bool:
        """Write `record` only if the stored batch is still `expected` (a cancel that came meanwhile
        is not overwritten); whether it was written."""
        key = keys.batch_record(record.id)
        async with self._redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(key)
                raw = cast(bytes | None, await pipe.get(key))
                if raw is None or _decoder.decode(raw).status != expected:
                    return False
                pipe.multi()
                self._queue_save(pipe, record)
                await pipe.execute()
            except WatchError:
                return False
        return True

    def _queue_save(self, pipe: Any, record: BatchRecord) -> None:
        pipe.set(keys.batch_record(record.id), _encoder.encode(record))
        if record.status not in ACTIVE:
            pipe.zrem(keys.batches_active(), record.id)
            pipe.expire(keys.batch_record(record.id), keys.BATCH_KEPT_S)
            pipe.expire(keys.batch_results(record.id), keys.BATCH_KEPT_S)
            pipe.delete(keys.batch_counts(record.id))

    async def get(self, batch_id: str) -> BatchRecord | None:
        if not batch_id.startswith(ID_PREFIX):
            return None
        raw = cast(bytes | None, await self._redis.get(keys.batch_record(batch_id)))
        return _decoder.decode(raw) if raw is not None else None

    async def owned(self, batch_id: str, owner: str) -> BatchRecord:
        """The batch as its owner sees it now (a running one with its lines finished so far); the 404
        of an unknown batch for anyone else."""
        record = await self.get(batch_id)
        if record is None or record.owner != owner:
            raise NoSuchBatchError(batch_id)
        return await self.with_counts(record)

    async def with_counts(self, record: BatchRecord) -> BatchRecord:
        if record.status not in ACTIVE:
            return record
        raw = cast(
            list[bytes | None], await self._redis.hmget(keys.batch_counts(record.id), ["completed", "failed"])
        )
        completed, failed = (int(value) if value is not None else 0 for value in raw)
        return msgspec.structs.replace(record, completed=completed, failed=failed)

    async def page(self, owner: str, *, limit: int, after: str | None) -> tuple[list[BatchRecord], bool]:
        """Up to `limit` of `owner`'s batches after `after`, newest first, and whether more follow."""
        ids = [
            raw.decode()
            for raw in cast(list[bytes], await self._redis.zrevrange(keys.batches_of(owner), 0, -1))
        ]
        if after is not None:
            if after not in ids:
                raise NoSuchBatchError(after)
            ids = ids[ids.index(after) + 1 :]
        found: list[BatchRecord] = []
        for start in range(0, len(ids), 100):
            raws = cast(
                list[bytes | None],
                await self._redis.mget([keys.batch_record(i) for i in ids[start : start + 100]]),
            )
            found += [_decoder.decode(raw) for raw in raws if raw is not None]
            if len(found) > limit:
                break
        return [await self.with_counts(record) for record in found[:limit]], len(found) > limit

    async def active(self) -> list[str]:
        return [
            raw.decode() for raw in cast(list[bytes], await self._redis.zrange(keys.batches_active(), 0, -1))
        ]

    async def finish_line(self, batch_id: str, custom_id: str, result: LineResult) -> None:
        """Keep a finished line (once: a line run again after a takeover keeps its first result)."""
        if await self._redis.hsetnx(keys.batch_results(batch_id), custom_id, _encoder.encode(result)):
            await self._redis.hincrby(keys.batch_counts(batch_id), "completed" if result.ok else "failed", 1)

    async def finished_lines(self, batch_id: str) -> dict[str, LineResult]:
        raw = cast(dict[bytes, bytes], await self._redis.hgetall(keys.batch_results(batch_id)))
        return {key.decode(): _result_decoder.decode(value) for key, value in raw.items()}

    async def finished_ids(self, batch_id: str) -> set[str]:
        return {
            raw.decode() for raw in cast(list[bytes], await self._redis.hkeys(keys.batch_results(batch_id)))
        }


def cancelled(record: BatchRecord, now: float) -> BatchRecord:
    """`record` asked to stop: its lines not started are not run, those running end first."""
    return msgspec.structs.replace(record, status="cancelling", cancelling_at=now)
