"""OpenAI's Files API: upload a batch's input, list, read and delete a key's files.

Each file belongs to the key that uploaded it (`router.files.records`); every handler asks the
service for the caller's own and gets the 404 of an unknown file for anyone else's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from litestar import Request, Response, delete, get, post
from litestar.params import Parameter
from litestar.response import Stream

from router.admission.auth import Caller
from router.files.service import FileService
from router.gate.gate import GATE_OPT
from router.gate.upload import UPLOAD
from router.http.answers import json_response
from router.openai.files import FileDeleted, FileList

# OpenAI's bound on one page of `GET /v1/files`.
MAX_PAGE = 10_000


# The front door's `max_body_bytes` is for JSON bodies held in memory; an upload streams to disk, and
# its gate bounds it by `files.max_file_bytes` instead.
@post("/v1/files", status_code=200, opt={GATE_OPT: UPLOAD}, request_max_body_size=None)
async def upload_file(request: Request[Any, Any, Any], files: FileService, caller: Caller) -> Response[bytes]:
    """A file uploaded as `multipart/form-data` (`file`, `purpose`, `expires_after`)."""
    record = await files.upload(request, caller)
    return json_response(record.as_openai())


@get("/v1/files")
async def list_files(
    files: FileService,
    caller: Caller,
    purpose: str | None = None,
    limit: Annotated[int, Parameter(ge=1, le=MAX_PAGE)] = MAX_PAGE,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> Response[bytes]:
    """The caller's files, newest first (`order=asc`: oldest first), a page of `limit` after `after`."""
    records, more = await files.page(
        caller, limit=limit, after=after, newest_first=order == "desc", purpose=purpose
    )
    data = [record.as_openai() for record in records]
    first, last = (data[0].id, data[-1].id) if data else (None, None)
    return json_response(FileList(data=data, has_more=more, first_id=first, last_id=last))


@get("/v1/files/{file_id:str}")
async def retrieve_file(file_id: str, files: FileService, caller: Caller) -> Response[bytes]:
    return json_response((await files.owned(file_id, caller)).as_openai())


@get("/v1/files/{file_id:str}/content")
async def file_content(file_id: str, files: FileService, caller: Caller) -> Stream:
    """The file's bytes, streamed from the store as they are read."""
    record = await files.owned(file_id, caller)
    return Stream(
        await files.content(record),
        media_type="application/octet-stream",
        headers={"content-disposition": f'attachment; filename="{record.filename.replace(chr(34), "")}"'},
    )


@delete("/v1/files/{file_id:str}", status_code=200)
async def delete_file(file_id: str, files: FileService, caller: Caller) -> Response[bytes]:
    record = await files.owned(file_id, caller)
    await files.delete(record)
    return json_response(FileDeleted(id=record.id))
