"""The upload gate and its multipart parser: a Files API upload's file streamed to disk, its fields
kept, and every malformed, oversized or cut-short body refused with its 4xx and no file left behind.

Bodies are built by httpx's multipart encoder (what the OpenAI SDK sends) and fed in 7-byte chunks,
so that every boundary, header and part crosses a chunk's edge.
"""

from __future__ import annotations

import asyncio
import stat
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar import Litestar, Request, Response, post
from litestar.testing import TestClient

from router.files.upload import MAX_FIELDS, Upload, received_upload
from router.gate.gate import GATE_OPT, GatedRequest
from router.gate.upload import MULTIPART_OVERHEAD_BYTES, UPLOAD, UploadGate
from router.openai.errors import InvalidRequestError, OpenAIError, PayloadTooLargeError

JSONL = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n' * 3
FIELDS = {"purpose": "batch", "expires_after[anchor]": "created_at", "expires_after[seconds]": "3600"}
CHUNK = 7


def multipart(data: Mapping[str, str] | None = None, files: Any = None) -> tuple[bytes, str]:
    """An encoded multipart body, and its Content-Type (with its boundary)."""
    request = httpx.Request("POST", "http://x", data=data, files=files)
    return request.read(), request.headers["content-type"]


def boundary_of(content_type: str) -> bytes:
    return content_type.split("boundary=", 1)[1].encode()


async def chunked(body: bytes, size: int = CHUNK) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


async def receive(
    body: bytes, boundary: bytes, spool: Path, *, max_file_bytes: int = 10_000, max_field_bytes: int = 64
) -> Upload:
    return await received_upload(
        chunked(body),
        boundary,
        spool_dir=spool,
        max_file_bytes=max_file_bytes,
        max_field_bytes=max_field_bytes,
    )


def raw_multipart(*parts: tuple[str, bytes]) -> bytes:
    """A hand-built body (what httpx cannot send): each part's Content-Disposition and bytes."""
    body = b"".join(
        b"--B\r\nContent-Disposition: " + disposition.encode() + b"\r\n\r\n" + value + b"\r\n"
        for disposition, value in parts
    )
    return body + b"--B--\r\n"


def leftovers(spool: Path) -> list[Path]:
    """The files left in the spool directory."""
    return list(spool.iterdir())


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    path = tmp_path / "spool"
    path.mkdir()
    return path


# ---- the parser ----


async def test_fields_and_file_are_received_exactly(spool: Path) -> None:
    body, content_type = multipart(FIELDS, {"file": ("in.jsonl", JSONL, "application/jsonl")})
    upload = await receive(body, boundary_of(content_type), spool)
    assert upload.fields == FIELDS
    assert upload.filename == "in.jsonl"
    assert upload.size == len(JSONL)
    assert upload.path is not None and upload.path.parent == spool
    assert upload.path.read_bytes() == JSONL
    # Only its owner can read what a key uploaded.
    assert stat.S_IMODE(upload.path.stat().st_mode) == 0o600
    upload.discard()
    assert not leftovers(spool)
    upload.discard()  # a file already gone is no error


async def test_a_file_of_exactly_its_bound_is_taken(spool: Path) -> None:
    body, content_type = multipart({"purpose": "batch"}, {"file": ("in.jsonl", JSONL)})
    upload = await receive(body, boundary_of(content_type), spool, max_file_bytes=len(JSONL))
    assert upload.size == len(JSONL)
    upload.discard()


async def test_without_a_file_part_there_is_no_file(spool: Path) -> None:
    body, content_type = multipart({"purpose": "batch"}, {"other": ("x.txt", b"not the file")})
    upload = await receive(body, boundary_of(content_type), spool)
    assert upload == Upload(
        fields={"purpose": "batch", "other": "not the file"}, filename=None, path=None, size=0
    )
    assert not leftovers(spool)


async def test_a_file_past_its_bound_is_413_and_leaves_nothing(spool: Path) -> None:
    body, content_type = multipart({"purpose": "batch"}, {"file": ("in.jsonl", JSONL)})
    with pytest.raises(PayloadTooLargeError) as raised:
        await receive(body, boundary_of(content_type), spool, max_file_bytes=len(JSONL) - 1)
    assert raised.value.status_code == 413
    assert not leftovers(spool)


async def test_a_field_past_its_bound_is_400(spool: Path) -> None:
    body, content_type = multipart({"purpose": "b" * 65}, {"file": ("in.jsonl", JSONL)})
    with pytest.raises(InvalidRequestError) as raised:
        await receive(body, boundary_of(content_type), spool, max_field_bytes=64)
    assert (raised.value.status_code, raised.value.param) == (400, "purpose")
    assert not leftovers(spool)


# Past the closing boundary's `--` (its last 2 bytes are the CRLF after it, which may be lost).
@pytest.mark.parametrize("cut", [3, 5, 40, len(JSONL) // 2])
async def test_a_body_cut_short_is_400_and_leaves_nothing(spool: Path, cut: int) -> None:
    body, content_type = multipart({"purpose": "batch"}, {"file": ("in.jsonl", JSONL)})
    with pytest.raises(InvalidRequestError) as raised:
        await receive(body[:-cut], boundary_of(content_type), spool)
    assert (raised.value.status_code, raised.value.code) == (400, "invalid_multipart")
    assert not leftovers(spool)


@pytest.mark.parametrize("body", [b"", b"this is not multipart at all", b'{"purpose": "batch"}'])
async def test_a_body_that_is_not_multipart_is_400(spool: Path, body: bytes) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        await receive(body, b"B", spool)
    assert (raised.value.status_code, raised.value.code) == (400, "invalid_multipart")


async def test_two_file_parts_are_400_and_leave_nothing(spool: Path) -> None:
    body, content_type = multipart(files=[("file", ("a.jsonl", JSONL)), ("file", ("b.jsonl", JSONL))])
    with pytest.raises(InvalidRequestError, match="more than one `file`"):
        await receive(body, boundary_of(content_type), spool)
    assert not leftovers(spool)


async def test_a_field_sent_twice_is_400(spool: Path) -> None:
    body = raw_multipart(('form-data; name="purpose"', b"batch"), ('form-data; name="purpose"', b"fine-tune"))
    with pytest.raises(InvalidRequestError, match="twice"):
        await receive(body, b"B", spool)


async def test_too_many_fields_are_400(spool: Path) -> None:
    body, content_type = multipart(
        {f"f{n}": "x" for n in range(MAX_FIELDS + 1)}, {"file": ("in.jsonl", JSONL)}
    )
    with pytest.raises(InvalidRequestError, match=f"more than {MAX_FIELDS} fields"):
        await receive(body, boundary_of(content_type), spool)


async def test_a_field_not_utf8_is_400(spool: Path) -> None:
    body = raw_multipart(('form-data; name="purpose"', b"\xff\xfe"))
    with pytest.raises(InvalidRequestError, match="UTF-8") as raised:
        await receive(body, b"B", spool)
    assert raised.value.param == "purpose"


@pytest.mark.parametrize("disposition", ["form-data", 'attachment; name="purpose"', 'form-data; name=""'])
async def test_a_part_without_a_form_data_name_is_400(spool: Path, disposition: str) -> None:
    with pytest.raises(InvalidRequestError, match="Content-Disposition"):
        await receive(raw_multipart((disposition, b"batch")), b"B", spool)


async def test_a_utf8_filename_is_kept(spool: Path) -> None:
    body = raw_multipart(('form-data; name="file"; filename="données.jsonl"', JSONL))
    upload = await receive(body, b"B", spool)
    assert upload.filename == "données.jsonl"
    upload.discard()


async def test_an_upload_cancelled_mid_file_leaves_nothing(spool: Path) -> None:
    body, content_type = multipart({"purpose": "batch"}, {"file": ("in.jsonl", JSONL)})

    async def cancelled_midway() -> AsyncIterator[bytes]:
        yield body[: len(body) // 2]
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await received_upload(
            cancelled_midway(),
            boundary_of(content_type),
            spool_dir=spool,
            max_file_bytes=10_000,
            max_field_bytes=64,
        )
    assert not leftovers(spool)


# ---- the gate, on an app ----

MAX_FILE_BYTES = 1000
OTHER_GATE = UploadGate("other")


def _openai_error(_: Request[Any, Any, Any], exc: OpenAIError) -> Response[Any]:
    return Response({"error": {"message": exc.message, "code": exc.code}}, status_code=exc.status_code)


def _bug(_: Request[Any, Any, Any], exc: RuntimeError) -> Response[Any]:
    # A handler's bug: shown here, so that a test sees which one it was.
    return Response({"bug": str(exc)}, status_code=500)


@pytest.fixture
def client(spool: Path) -> Iterator[TestClient[Litestar]]:
    async def received(request: Request[Any, Any, Any]) -> dict[str, Any]:
        upload = await UPLOAD.received(request, spool_dir=spool, max_file_bytes=MAX_FILE_BYTES)
        try:
            data = upload.path.read_text() if upload.path else None
            return {"fields": upload.fields, "filename": upload.filename, "data": data}
        finally:
            upload.discard()

    @post("/v1/files", opt={GATE_OPT: UPLOAD}, request_max_body_size=None)
    async def files(request: Request[Any, Any, Any]) -> dict[str, Any]:
        return await received(request)

    @post("/other", opt={GATE_OPT: OTHER_GATE}, request_max_body_size=None)
    async def other(request: Request[Any, Any, Any]) -> dict[str, Any]:
        return await received(request)

    # The app's bound of JSON bodies, left on the route: below the uploads it takes.
    @post("/unlifted", opt={GATE_OPT: UPLOAD}, request_max_body_size=10_000)
    async def unlifted(request: Request[Any, Any, Any]) -> dict[str, Any]:
        return await received(request)

    app = Litestar(
        [files, other, unlifted],
        request_class=GatedRequest,
        exception_handlers={OpenAIError: _openai_error, RuntimeError: _bug},
    )
    with TestClient(app) as client:
        yield client


def test_an_upload_passes_the_gate(client: TestClient[Litestar], spool: Path) -> None:
    response = client.post(
        "/v1/files", data=FIELDS, files={"file": ("in.jsonl", JSONL[:500], "application/jsonl")}
    )
    assert response.status_code == 201, response.text
    assert response.json() == {"fields": FIELDS, "filename": "in.jsonl", "data": JSONL[:500].decode()}
    assert not leftovers(spool)


@pytest.mark.parametrize(
    ("content_type", "body"),
    [("text/plain", b"purpose=batch"), ("application/json", b'{"purpose": "batch"}'), (None, b"x")],
)
def test_a_body_that_is_not_multipart_is_415(
    client: TestClient[Litestar], content_type: str | None, body: bytes
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    response = client.post("/v1/files", content=body, headers=headers)
    assert response.status_code == 415
    assert "multipart/form-data" in response.json()["error"]["message"]
    if content_type:
        assert f"`{content_type}`" in response.json()["error"]["message"]


def test_multipart_without_a_boundary_is_400(client: TestClient[Litestar]) -> None:
    response = client.post("/v1/files", content=b"x", headers={"content-type": "multipart/form-data"})
    assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_multipart")


def test_a_content_length_past_the_bound_is_413(client: TestClient[Litestar], spool: Path) -> None:
    body, content_type = multipart({"purpose": "batch"}, {"file": ("in.jsonl", b"x" * (MAX_FILE_BYTES + 1))})
    response = client.post("/v1/files", content=body, headers={"content-type": content_type})
    assert response.status_code == 413
    assert "uploaded file is over" in response.json()["error"]["message"]  # the file's own bound
    padding = b"x" * (MAX_FILE_BYTES + MULTIPART_OVERHEAD_BYTES + 1)
    response = client.post("/v1/files", content=padding, headers={"content-type": content_type})
    assert response.status_code == 413
    assert "upload is over" in response.json()["error"]["message"]  # the body's, from its Content-Length
    assert not leftovers(spool)


def test_a_chunked_body_past_the_bound_is_413(client: TestClient[Litestar], spool: Path) -> None:
    body, content_type = multipart({"purpose": "batch"}, {"file": ("in.jsonl", JSONL)})

    def endless() -> Iterator[bytes]:
        yield body
        # An epilogue, which the parser skips: only the body's bound stops it.
        for _ in range(MULTIPART_OVERHEAD_BYTES // 65536 + 2):
            yield b"x" * 65536

    response = client.post("/v1/files", content=endless(), headers={"content-type": content_type})
    assert response.status_code == 413
    assert "upload is over" in response.json()["error"]["message"]
    assert not leftovers(spool)


def test_a_route_that_declares_another_gate_is_a_500(client: TestClient[Litestar]) -> None:
    response = client.post("/other", data={"purpose": "batch"}, files={"file": ("in.jsonl", JSONL)})
    assert response.status_code == 500
    assert "a gate its route does not declare" in response.json()["bug"]


def test_a_route_that_keeps_a_smaller_body_bound_is_a_500(client: TestClient[Litestar]) -> None:
    response = client.post("/unlifted", data={"purpose": "batch"}, files={"file": ("in.jsonl", JSONL)})
    assert response.status_code == 500
    assert "request_max_body_size" in response.json()["bug"]
