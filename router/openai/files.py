"""OpenAI Files endpoint structs (`/v1/files`)."""

from __future__ import annotations

from typing import Literal

import msgspec

# The purpose an upload may have here: `batch` (the Batch API's input). Switchboard itself writes
# files of purpose `batch_output` (a batch's output and error files).
UPLOAD_PURPOSES = ("batch",)


class FileObject(msgspec.Struct, kw_only=True):
    """One file as OpenAI describes it."""

    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    expires_at: int | None = None
    object: Literal["file"] = "file"
    status: Literal["uploaded", "processed", "error"] = "processed"
    status_details: str | None = None


class FileList(msgspec.Struct, kw_only=True):
    """A page of the caller's files, newest first unless asked otherwise."""

    data: list[FileObject]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None
    object: Literal["list"] = "list"


class FileDeleted(msgspec.Struct, kw_only=True):
    id: str
    deleted: bool = True
    object: Literal["file"] = "file"
