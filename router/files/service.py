"""The Files API's work: an upload checked and kept, a key's files listed, read and deleted, and
expired files swept away.

An upload streams to a spool file on the front door's disk (`router.gate.upload`), a batch file's
lines are checked there (`router.files.batch_lines`, off the event loop), and only then is it put in
the store (`switchboard.file_store`) and its record written (`router.files.records`): a refused
upload leaves nothing behind. Every front door sweeps the files whose expiry has come; a sweep that
meets a record another front door removed meanwhile passes on.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from litestar import Request

from router.admission.auth import Caller
from router.files.batch_lines import BatchFileCheck
from router.files.records import FileRecord, FileRecords, new_file_id
from router.files.upload import Upload
from router.gate.upload import UPLOAD
from router.openai.errors import InvalidRequestError, NoSuchFileError
from router.openai.files import UPLOAD_PURPOSES
from switchboard.config import ModelKind, Settings
from switchboard.file_store import FileStore, file_store
from switchboard.tasks import TaskSet, poll

logger = logging.getLogger(__name__)

SWEEP_EVERY_S = 60.0
# OpenAI's bounds on an upload's `expires_after.seconds`: an hour to 30 days.
MIN_EXPIRY_S = 3600


class FileService:
    """One front door's files: its store, the shared records, and the sweep of expired ones."""

    def __init__(
        self, settings: Settings, records: FileRecords, kind_of: Callable[[str], ModelKind | None]
    ) -> None:
        self._settings = settings
        self._records = records
        self._kind_of = kind_of
        self._opened_store: FileStore | None = None
        # Where uploads are written while they arrive and are checked (made at the first upload).
        self._spool: Path | None = None

    @property
    def _store(self) -> FileStore:
        """The store, opened on first use (a front door nobody uploads to makes no folder)."""
        if self._opened_store is None:
            self._opened_store = file_store(self._settings.files.store, self._settings.files.storage)
        return self._opened_store

    def start(self, tasks: TaskSet) -> None:
        tasks.start(poll(self.sweep, SWEEP_EVERY_S, "sweep expired files"), "expired files")

    def close(self) -> None:
        """Remove the spool folder (uploads still being read when the front door stops)."""
        if self._spool is not None:
            shutil.rmtree(self._spool, ignore_errors=True)

    async def upload(self, request: Request[Any, Any, Any], caller: Caller) -> FileRecord:
        """The file a multipart upload sends, checked, stored and recorded for `caller`'s key."""
        limits = self._settings.files
        if self._spool is None:
            self._spool = Path(tempfile.mkdtemp(prefix="switchboard-uploads-"))
        upload = await UPLOAD.received(request, spool_dir=self._spool, max_file_bytes=limits.max_file_bytes)
        try:
            purpose, filename, path = _purpose(upload), _filename(upload), _file(upload)
            expires_after = _expires_after(upload, limits.max_age_s)
            lines = await asyncio.to_thread(self._batch_check(caller).lines, path)
            now = time.time()
            record = FileRecord(
                id=new_file_id(),
                owner=caller.owner,
                purpose=purpose,
                filename=filename,
                bytes=upload.size,
                created_at=now,
                expires_at=now + expires_after,
                lines=lines,
            )
            await self._store.put(record.id, path)
        finally:
            upload.discard()
        await self._records.add(record)
        return record

    def _batch_check(self, caller: Caller) -> BatchFileCheck:
        return BatchFileCheck(
            caller=caller,
            kind_of=self._kind_of,
            bounds=self._settings.router,
            max_lines=self._settings.files.max_file_lines,
        )

    async def keep(self, *, owner: str, filename: str, path: Path, purpose: str) -> FileRecord:
        """A file the front door wrote (a batch's output or error file) kept for `owner`, as an upload
        is; the caller removes `path`."""
        now = time.time()
        record = FileRecord(
            id=new_file_id(),
            owner=owner,
            purpose=purpose,
            filename=filename,
            bytes=(await asyncio.to_thread(path.stat)).st_size,
            created_at=now,
            expires_at=now + self._settings.files.max_age_s,
        )
        await self._store.put(record.id, path)
        await self._records.add(record)
        return record

    async def record(self, file_id: str) -> FileRecord | None:
        """The record of `file_id`, whoever owns it (for the batch runner, which acts for its owner)."""
        return await self._records.get(file_id)

    async def owned(self, file_id: str, caller: Caller) -> FileRecord:
        return await self._records.owned(file_id, caller.owner)

    async def page(
        self, caller: Caller, *, limit: int, after: str | None, newest_first: bool, purpose: str | None
    ) -> tuple[list[FileRecord], bool]:
        return await self._records.page(
            caller.owner, limit=limit, after=after, newest_first=newest_first, purpose=purpose
        )

    async def content(self, record: FileRecord) -> AsyncIterator[bytes]:
        """The file's bytes as the store streams them; the 404 of an unknown file if the store has
        lost them (checked before the answer starts, so that it is a status, not a cut stream)."""
        if await self._store.size(record.id) is None:
            raise NoSuchFileError(record.id)
        return self._store.read(record.id)

    async def delete(self, record: FileRecord) -> None:
        """Forget the file, then delete its contents (a crash between leaves only unreachable bytes,
        which the store's own lifecycle rules may collect; never a record without its file)."""
        await self._records.remove(record)
        await self._store.delete(record.id)

    async def sweep(self) -> None:
        """Delete the files whose expiry has come."""
        for file_id in await self._records.due(time.time()):
            record = await self._records.get(file_id)
            if record is None:
                await self._records.forget(file_id)
                continue
            await self.delete(record)
            logger.info("file expired", extra={"file_id": file_id, "purpose": record.purpose})


def _purpose(upload: Upload) -> str:
    purpose = upload.fields.get("purpose")
    if purpose is None:
        raise InvalidRequestError(
            "Missing `purpose`: send the form field `purpose=batch`.",
            param="purpose",
            code="missing_required_parameter",
        )
    if purpose not in UPLOAD_PURPOSES:
        raise InvalidRequestError(
            f"Files of purpose {purpose!r} are not kept here; upload batch input files with `purpose=batch`.",
            param="purpose",
            code="invalid_value",
        )
    return purpose


def _filename(upload: Upload) -> str:
    name = Path(upload.filename or "").name
    if not name.endswith(".jsonl"):
        raise InvalidRequestError(
            "A batch file must be JSON Lines, with a name ending in `.jsonl`.",
            param="file",
            code="invalid_file_format",
        )
    return name


def _file(upload: Upload) -> Path:
    if upload.path is None:
        raise InvalidRequestError(
            "Missing `file`: send the file as the form's `file` part.",
            param="file",
            code="missing_required_parameter",
        )
    return upload.path


def _expires_after(upload: Upload, max_age_s: float) -> float:
    """The seconds the file lives: `expires_after[seconds]` (anchored at its creation), at most the
    store's `max_age_s`; that when the upload says nothing."""
    anchor = upload.fields.get("expires_after[anchor]")
    seconds = upload.fields.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return max_age_s
    if anchor != "created_at":
        raise InvalidRequestError(
            "`expires_after[anchor]` must be `created_at`.",
            param="expires_after.anchor",
            code="invalid_value",
        )
    try:
        value = int(seconds or "")
    except ValueError:
        value = -1
    if not MIN_EXPIRY_S <= value <= max_age_s:
        raise InvalidRequestError(
            f"`expires_after[seconds]` must be from {MIN_EXPIRY_S} to {int(max_age_s)}.",
            param="expires_after.seconds",
            code="invalid_value",
        )
    return float(value)
