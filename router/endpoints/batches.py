"""OpenAI's Batch API: create a batch from an uploaded file, read it, list a key's batches, cancel one.

A batch runs in the background (`router.batches.runner`); these handlers write and read its record.
Each batch belongs to the key that created it: any other key gets the 404 of an unknown batch.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from litestar import Request, Response, get, post
from litestar.params import Parameter

from router.admission.auth import Caller
from router.batches.records import BatchRecord, BatchRecords, cancelled, new_batch_id
from router.files.service import FileService
from router.gate.batches import BATCH_CANCEL, BATCH_CREATE
from router.gate.gate import GATE_OPT
from router.http.answers import json_response
from router.openai.batches import BatchList
from router.openai.errors import InvalidRequestError

# The only completion window OpenAI offers.
WINDOW_S = 24 * 3600
MAX_PAGE = 100


@post("/v1/batches", status_code=200, opt={GATE_OPT: BATCH_CREATE})
async def create_batch(
    request: Request[Any, Any, Any], batches: BatchRecords, files: FileService, caller: Caller
) -> Response[bytes]:
    """A batch of the requests in an uploaded `batch` file, to run within 24 hours."""
    body = await BATCH_CREATE.passed(request)
    file = await files.owned(body.input_file_id, caller)
    if file.purpose != "batch":
        raise InvalidRequestError(
            f"The file {file.id} has purpose {file.purpose!r}; a batch's input is a file uploaded with "
            "purpose `batch`.",
            param="input_file_id",
            code="invalid_value",
        )
    now = time.time()
    record = BatchRecord(
        id=new_batch_id(),
        owner=caller.owner,
        input_file_id=file.id,
        endpoint=body.endpoint,
        status="validating",
        created_at=now,
        expires_at=now + WINDOW_S,
        metadata=body.metadata,
        total=file.lines,
    )
    await batches.add(record)
    return json_response(record.as_openai())


@get("/v1/batches/{batch_id:str}")
async def retrieve_batch(batch_id: str, batches: BatchRecords, caller: Caller) -> Response[bytes]:
    return json_response((await batches.owned(batch_id, caller.owner)).as_openai())


@get("/v1/batches")
async def list_batches(
    batches: BatchRecords,
    caller: Caller,
    limit: Annotated[int, Parameter(ge=1, le=MAX_PAGE)] = 20,
    after: str | None = None,
) -> Response[bytes]:
    """The caller's batches, newest first."""
    records, more = await batches.page(caller.owner, limit=limit, after=after)
    data = [record.as_openai() for record in records]
    first, last = (data[0].id, data[-1].id) if data else (None, None)
    return json_response(BatchList(data=data, has_more=more, first_id=first, last_id=last))


@post("/v1/batches/{batch_id:str}/cancel", status_code=200, opt={GATE_OPT: BATCH_CANCEL})
async def cancel_batch(
    request: Request[Any, Any, Any], batch_id: str, batches: BatchRecords, caller: Caller
) -> Response[bytes]:
    """Stop a batch: the lines running end, the rest never start; what finished is in its files."""
    await BATCH_CANCEL.passed(request)
    while True:
        record = await batches.owned(batch_id, caller.owner)
        if record.status == "cancelling":
            break
        if record.status not in ("validating", "in_progress"):
            raise InvalidRequestError(
                f"The batch {batch_id} is {record.status}; only a batch that is validating or in "
                "progress can be cancelled.",
                param="batch_id",
                code="invalid_state",
            )
        asked = cancelled(record, time.time())
        if await batches.save_if(asked, record.status):  # else the runner moved it meanwhile: again
            record = asked
            break
    return json_response(record.as_openai())
