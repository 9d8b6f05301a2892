"""The records of uploaded files in Redis: who owns each, what it is, when it goes.

A file's contents are in the file store (`switchboard.file_store`); its record is here, shared by
every front door: one key per file (msgpack), the ids of each key's files by upload time (what
`GET /v1/files` pages through), and every id by expiry (what the sweep deletes). A file belongs to
the key that uploaded it, by the key's identity (`Caller.owner`, the SHA-256 of its secret): any
other key reads, lists and deletes none of it, and gets the 404 of a file that does not exist.
"""

from __future__ import annotations

import secrets
from typing import cast

import msgspec
import redis.asyncio as aioredis

from router.openai.errors import NoSuchFileError
from router.openai.files import FileObject
from switchboard import keys

# "file-" and 24 random characters, as OpenAI's ids look.
ID_PREFIX = "file-"
_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


class FileRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One uploaded (or written) file."""

    id: str
    owner: str
    purpose: str
    filename: str
    bytes: int
    created_at: float
    expires_at: float
    # Requests in a batch input file (its lines); 0 for other files.
    lines: int = 0

    def as_openai(self) -> FileObject:
        return FileObject(
            id=self.id,
            bytes=self.bytes,
            created_at=int(self.created_at),
            expires_at=int(self.expires_at),
            filename=self.filename,
            purpose=self.purpose,
        )


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(FileRecord)


def new_file_id() -> str:
    return ID_PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(24))


class FileRecords:
    """Every front door's view of the files' records."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    async def add(self, record: FileRecord) -> None:
        """Keep `record`, listed for its owner and due for the sweep at its expiry."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(keys.file_record(record.id), _encoder.encode(record))
            pipe.zadd(keys.files_of(record.owner), {record.id: record.created_at})
            pipe.zadd(keys.files_expiring(), {record.id: record.expires_at})
            await pipe.execute()

    async def owned(self, file_id: str, owner: str) -> FileRecord:
        """The record of `file_id` if `owner` uploaded it; the 404 of an unknown file otherwise."""
        record = await self.get(file_id)
        if record is None or record.owner != owner:
            raise NoSuchFileError(file_id)
        return record

    async def get(self, file_id: str) -> FileRecord | None:
        if not file_id.startswith(ID_PREFIX):
            return None
        raw = cast(bytes | None, await self._redis.get(keys.file_record(file_id)))
        return _decoder.decode(raw) if raw is not None else None

    async def page(
        self, owner: str, *, limit: int, after: str | None, newest_first: bool, purpose: str | None
    ) -> tuple[list[FileRecord], bool]:
        """Up to `limit` of `owner`'s files after the file `after` (by upload time), and whether more
        follow. A purpose filters the page as it is read."""
        ids = await self._ids_after(owner, after, newest_first)
        found: list[FileRecord] = []
        for start in range(0, len(ids), 100):
            batch = ids[start : start + 100]
            raws = cast(list[bytes | None], await self._redis.mget([keys.file_record(i) for i in batch]))
            records = [_decoder.decode(raw) for raw in raws if raw is not None]
            found += [r for r in records if purpose is None or r.purpose == purpose]
            if len(found) > limit:
                break
        return found[:limit], len(found) > limit

    async def _ids_after(self, owner: str, after: str | None, newest_first: bool) -> list[str]:
        index = keys.files_of(owner)
        ordered = cast(
            list[bytes],
            await (self._redis.zrevrange(index, 0, -1) if newest_first else self._redis.zrange(index, 0, -1)),
        )
        ids = [raw.decode() for raw in ordered]
        if after is None:
            return ids
        if after not in ids:
            raise NoSuchFileError(after)
        return ids[ids.index(after) + 1 :]

    async def remove(self, record: FileRecord) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(keys.file_record(record.id))
            pipe.zrem(keys.files_of(record.owner), record.id)
            pipe.zrem(keys.files_expiring(), record.id)
            await pipe.execute()

    async def due(self, now: float, limit: int = 100) -> list[str]:
        """Ids of files whose expiry has come (the oldest first)."""
        raw = cast(list[bytes], await self._redis.zrangebyscore(keys.files_expiring(), "-inf", now, 0, limit))
        return [item.decode() for item in raw]

    async def forget(self, file_id: str) -> None:
        """Drop an id from the sweep's index whose record is gone (deleted meanwhile)."""
        await self._redis.zrem(keys.files_expiring(), file_id)
