"""OpenAI Batch endpoint structs (`/v1/batches`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]
# OpenAI's bounds on a batch's metadata: 16 pairs, keys of 64 characters, values of 512.
Metadata = Annotated[
    dict[Annotated[str, msgspec.Meta(max_length=64)], Annotated[str, msgspec.Meta(max_length=512)]],
    msgspec.Meta(max_length=16),
]


class BatchCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """`POST /v1/batches` body."""

    input_file_id: Annotated[str, msgspec.Meta(min_length=1)]
    endpoint: Literal["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"]
    completion_window: Literal["24h"]
    metadata: Metadata | None = None


class RequestCounts(msgspec.Struct, kw_only=True):
    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchError(msgspec.Struct, kw_only=True, omit_defaults=True):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(msgspec.Struct, kw_only=True):
    data: list[BatchError]
    object: Literal["list"] = "list"


class BatchObject(msgspec.Struct, kw_only=True):
    """One batch as OpenAI describes it."""

    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: int
    request_counts: RequestCounts
    errors: BatchErrors | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    metadata: dict[str, str] | None = None
    object: Literal["batch"] = "batch"


class BatchList(msgspec.Struct, kw_only=True):
    data: list[BatchObject]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None
    object: Literal["list"] = "list"


def line_output(custom_id: str, request_id: str, status_code: int, body: Any) -> dict[str, Any]:
    """One line of a batch's output file (a request that was answered), in OpenAI's shape."""
    return {
        "id": f"batch_req_{request_id}",
        "custom_id": custom_id,
        "response": {"status_code": status_code, "request_id": request_id, "body": body},
        "error": None,
    }


def line_error(custom_id: str, request_id: str, status_code: int | None, body: Any) -> dict[str, Any]:
    """One line of a batch's error file (a request that failed), in OpenAI's shape."""
    response = (
        None if status_code is None else {"status_code": status_code, "request_id": request_id, "body": body}
    )
    error = body.get("error") if isinstance(body, dict) else None
    return {"id": f"batch_req_{request_id}", "custom_id": custom_id, "response": response, "error": error}
