"""A batch's input file written straight to a front door's file store and records, as an upload
leaves it: for tests of the batch runner that need no HTTP upload."""

from __future__ import annotations

import json
import time
from pathlib import Path

import redis.asyncio as aioredis

from router.files.records import FileRecord, FileRecords, new_file_id
from switchboard.file_store import LocalFileStore


async def uploaded(redis: aioredis.Redis, store: Path, *, model: str, lines: int, owner: str = "") -> str:
    """A batch input file of `lines` chat requests for `model` (custom ids `q-0`...), owned by the
    key whose identity is `owner` ("" for the keyless caller); returns its id."""
    rows = [
        {
            "custom_id": f"q-{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": f"Hi {n}"}], "max_tokens": 3},
        }
        for n in range(lines)
    ]
    source = store.parent / "in.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    file_id = new_file_id()
    await LocalFileStore(store).put(file_id, source)
    now = time.time()
    record = FileRecord(
        id=file_id, owner=owner, purpose="batch", filename="in.jsonl", bytes=source.stat().st_size,
        created_at=now, expires_at=now + 3600, lines=lines,
    )  # fmt: skip
    await FileRecords(redis).add(record)
    return file_id
