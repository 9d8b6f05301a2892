"""The upload gate: what a Files API upload passes before anything else is done with it.

An upload is `multipart/form-data` (415 otherwise, 400 without its boundary) of up to hundreds of
megabytes, so unlike a JSON gate this one never holds the body: it streams it, as it is read, into
the multipart parser (`router.files.upload`), which spools the file to disk. Its size is bounded
twice: the whole body by the file's bound plus the multipart framing around it (413 from its
Content-Length, before anything is read, or as soon as a chunked body passes it), the file by its
own. The route declares the gate (`opt={GATE_OPT: UPLOAD}`) and the app's request class refuses a
body read that no gate opened (`router.gate.gate.GatedRequest`), as for every other gate.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from litestar import Request
from python_multipart.multipart import parse_options_header

from router.files.upload import Upload, received_upload
from router.gate.gate import GATE_OPEN_STATE, GATE_OPT, DeclaredGate
from router.openai.errors import InvalidRequestError, PayloadTooLargeError, UnsupportedMediaTypeError

# What a body may hold beyond its file: the parts' boundaries and headers and the small fields.
MULTIPART_OVERHEAD_BYTES = 1024 * 1024
# The bound of each text field (`purpose`, `expires_after[seconds]`, ...).
MAX_FIELD_BYTES = 64 * 1024


@dataclass(frozen=True, eq=False)
class UploadGate(DeclaredGate):
    """An upload endpoint's passage: multipart only, bounded as it streams, its file spooled."""

    # What the endpoint is called in messages ("files").
    api: str

    def __deepcopy__(self, memo: dict[int, Any]) -> UploadGate:
        # Litestar copies a route's `opt`; a gate is immutable and must stay the one declared.
        return self

    async def received(
        self,
        request: Request[Any, Any, Any],
        *,
        spool_dir: Path,
        max_file_bytes: int,
        max_field_bytes: int = MAX_FIELD_BYTES,
    ) -> Upload:
        """The request's upload: its fields, and its file spooled into `spool_dir` (the caller's to
        keep or discard). Raises 415, 400 or 413 (see the module), and deletes the spooled file
        first."""
        largest = max_file_bytes + MULTIPART_OVERHEAD_BYTES
        self._check_route(request, largest)
        boundary = _boundary(request)
        self._check_size(request.content_length, largest)
        request.state[GATE_OPEN_STATE] = True
        try:
            # Closed however the parsing ends, so that no generator of the body outlives its gate.
            async with (
                aclosing(request.stream()) as body,
                aclosing(self._bounded(body, largest)) as chunks,
            ):
                return await received_upload(
                    chunks,
                    boundary,
                    spool_dir=spool_dir,
                    max_file_bytes=max_file_bytes,
                    max_field_bytes=max_field_bytes,
                )
        finally:
            request.state[GATE_OPEN_STATE] = False

    def _check_route(self, request: Request[Any, Any, Any], largest: int) -> None:
        handler = request.route_handler
        if handler.opt.get(GATE_OPT) is not self:
            raise RuntimeError(f"{request.url.path}'s handler passes a gate its route does not declare")
        # Litestar cuts a body at the route's (or app's) own bound: one below the upload's would turn
        # large uploads into its bare 413s, so the route must lift it.
        limit = handler.resolve_request_max_body_size()
        if limit is not None and limit < largest:
            raise RuntimeError(
                f"{request.url.path}: the route's request_max_body_size ({limit:,}) is below the "
                f"{self.api} uploads it takes ({largest:,}); declare it None or at least that"
            )

    async def _bounded(self, chunks: AsyncIterator[bytes], largest: int) -> AsyncGenerator[bytes, None]:
        """`chunks`, refused (413) as soon as they pass `largest` bytes (a chunked body, or one sent
        past its Content-Length)."""
        received = 0
        async for chunk in chunks:
            received += len(chunk)
            self._check_size(received, largest)
            yield chunk

    def _check_size(self, size: int | None, largest: int) -> None:
        if size is not None and size > largest:
            raise PayloadTooLargeError(
                f"The {self.api} upload is over the {largest:,} bytes taken (a file of at most "
                f"{largest - MULTIPART_OVERHEAD_BYTES:,} bytes, and its form around it)."
            )


def _boundary(request: Request[Any, Any, Any]) -> bytes:
    """The multipart boundary of the request's Content-Type: 415 if it is not multipart/form-data,
    400 if it has no boundary."""
    media_type, options = parse_options_header(request.headers.get("content-type"))
    if media_type != b"multipart/form-data":
        shown = f"`{media_type.decode('latin-1')}`" if media_type else "no Content-Type"
        raise UnsupportedMediaTypeError(
            f"The request body was sent with {shown}; upload files as "
            "`Content-Type: multipart/form-data`, with the file in its `file` part."
        )
    boundary = options.get(b"boundary")
    if not boundary:
        raise InvalidRequestError(
            "The multipart/form-data Content-Type has no boundary; send "
            "`Content-Type: multipart/form-data; boundary=...`.",
            code="invalid_multipart",
        )
    return boundary


# The Files API's uploads (`POST /v1/files`).
UPLOAD = UploadGate("files")
