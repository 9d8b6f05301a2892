"""An upload's multipart/form-data body, parsed as it streams in: its file spooled to disk, every
other part kept as a small text field.

A Files API upload may be hundreds of megabytes, so it is never held in memory: the part named
`file` goes straight into a new temp file (mode 0600) in the spool directory, counted as it comes
(413 past its bound, before the byte past it is written), and every other part is a text field of
a few KiB at most (400 past its bound, past the number of fields taken, or if not UTF-8). A body
that is not multipart, or that ends before its closing boundary, is a 400. Whatever fails, the temp
file is gone before the error leaves; an upload received hands its file to the caller, who keeps it
or discards it (`Upload.discard`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from router.openai.errors import InvalidRequestError, PayloadTooLargeError

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

# The part that is the file; every other part is a text field.
FILE_PART = "file"
# The most text fields taken: each is bounded, so the memory an upload's fields hold is too.
MAX_FIELDS = 16


@dataclass(frozen=True)
class Upload:
    """An upload received: its text fields, and its file, spooled to `path` (None: none was sent)."""

    fields: dict[str, str]
    # As the client named it (None: no file, or a file part without a filename).
    filename: str | None
    path: Path | None
    # The file's bytes (0 without one).
    size: int

    def discard(self) -> None:
        """Delete the spooled file, if any (one already gone is no error)."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def invalid_multipart(message: str) -> InvalidRequestError:
    """The 400 of a body that is not the multipart upload it must be."""
    return InvalidRequestError(message, code="invalid_multipart")


async def received_upload(
    chunks: AsyncIterator[bytes],
    boundary: bytes,
    *,
    spool_dir: Path,
    max_file_bytes: int,
    max_field_bytes: int,
) -> Upload:
    """The multipart body that `chunks` stream, parsed as they come: its `file` part spooled into a
    new file in `spool_dir`, its other parts kept as text fields.

    Raises InvalidRequestError (400) for a body that is not valid multipart, ends early, sends two
    files or too many fields, or a field past `max_field_bytes` or not UTF-8; PayloadTooLargeError
    (413) for a file past `max_file_bytes`. The spooled file is deleted whatever is raised
    (cancellation included); the caller owns it once the upload is returned.
    """
    receiver = _Receiver(spool_dir, max_file_bytes=max_file_bytes, max_field_bytes=max_field_bytes)
    try:
        parser = _parser(boundary, receiver)
        async for chunk in chunks:
            _feed(parser, chunk)
        return receiver.received()
    except BaseException:
        receiver.discard()
        raise


def _parser(boundary: bytes, receiver: _Receiver) -> MultipartParser:
    try:
        return MultipartParser(boundary, receiver.callbacks())
    except FormParserError as exc:  # a boundary longer than multipart allows
        raise invalid_multipart(f"The multipart boundary is invalid: {exc}") from None


def _feed(parser: MultipartParser, chunk: bytes) -> None:
    try:
        parser.write(chunk)
    except FormParserError as exc:  # the parser's own errors; ours (4xx) pass through as they are
        raise invalid_multipart(f"The request body is not valid multipart/form-data: {exc}") from None


class _Receiver:
    """The parser's callbacks: each part's headers, then its data, into the spooled file or a field."""

    def __init__(self, spool_dir: Path, *, max_file_bytes: int, max_field_bytes: int) -> None:
        self._spool_dir = spool_dir
        self._max_file_bytes = max_file_bytes
        self._max_field_bytes = max_field_bytes
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.path: Path | None = None
        self.size = 0
        self._fd: int | None = None
        # Set by the closing boundary: a body without it was cut short.
        self._ended = False
        # The part being read: its headers as they come, then its name and (a field's) bytes.
        self._headers: dict[str, bytes] = {}
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._name = ""
        self._field = bytearray()

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self._on_part_begin,
            "on_header_field": self._on_header_field,
            "on_header_value": self._on_header_value,
            "on_header_end": self._on_header_end,
            "on_headers_finished": self._on_headers_finished,
            "on_part_data": self._on_part_data,
            "on_part_end": self._on_part_end,
            "on_end": self._on_end,
        }

    def received(self) -> Upload:
        """The upload, once the whole body has been parsed."""
        if not self._ended:
            raise invalid_multipart("The multipart body ends before its closing boundary.")
        self._close()
        return Upload(fields=dict(self.fields), filename=self.filename, path=self.path, size=self.size)

    def discard(self) -> None:
        """Close and delete the spooled file, if one was begun."""
        self._close()
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _on_part_begin(self) -> None:
        self._headers = {}
        self._name = ""
        self._field = bytearray()

    # A header's name and value may each come in pieces, split across chunks.
    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _on_header_end(self) -> None:
        self._headers[self._header_field.decode("latin-1").strip().lower()] = bytes(self._header_value)
        self._header_field = bytearray()
        self._header_value = bytearray()

    def _on_headers_finished(self) -> None:
        name, filename = _disposition(self._headers.get("content-disposition"))
        if name == FILE_PART:
            self._open_file(filename)
        elif name in self.fields:
            raise invalid_multipart(f"The multipart body sends the `{name}` field twice.")
        elif len(self.fields) >= MAX_FIELDS:
            raise invalid_multipart(f"The multipart body sends more than {MAX_FIELDS} fields.")
        self._name = name

    def _open_file(self, filename: str | None) -> None:
        if self.path is not None:
            raise invalid_multipart(f"The multipart body sends more than one `{FILE_PART}` part.")
        # mkstemp creates the file 0600, under a name nobody else can have taken.
        fd, path = tempfile.mkstemp(dir=self._spool_dir, prefix="upload-", suffix=".part")
        self._fd, self.path, self.filename = fd, Path(path), filename

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._name == FILE_PART:
            self._write(data, start, end)
        elif len(self._field) + end - start > self._max_field_bytes:
            raise InvalidRequestError(
                f"The `{self._name}` field is over {self._max_field_bytes:,} bytes.",
                param=self._name,
                code="invalid_value",
            )
        else:
            self._field += data[start:end]

    def _write(self, data: bytes, start: int, end: int) -> None:
        # Counted before it is written: no byte past the bound reaches the disk.
        self.size += end - start
        if self.size > self._max_file_bytes:
            raise PayloadTooLargeError(
                f"The uploaded file is over {self._max_file_bytes:,} bytes, the most that is taken."
            )
        assert self._fd is not None
        # Small writes (a chunk is 64 KiB at most) into the page cache: quick enough for the loop.
        view = memoryview(data)[start:end]
        while view:
            view = view[os.write(self._fd, view) :]

    def _on_part_end(self) -> None:
        if self._name == FILE_PART:
            self._close()
            return
        try:
            self.fields[self._name] = self._field.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequestError(
                f"The `{self._name}` field is not valid UTF-8.", param=self._name, code="invalid_value"
            ) from None

    def _on_end(self) -> None:
        self._ended = True


def _disposition(header: bytes | None) -> tuple[str, str | None]:
    """A part's name and filename (None: none given), from its Content-Disposition."""
    # Given bytes, the parser keeps the header's bytes as they are (latin-1 in, latin-1 out); clients
    # send names as UTF-8, so they are decoded as UTF-8 after.
    kind, options = parse_options_header(header)
    name = options.get(b"name")
    if kind != b"form-data" or not name:
        raise invalid_multipart(
            "Each part of a multipart body needs `Content-Disposition: form-data; name=...`."
        )
    filename = options.get(b"filename")
    return _text(name), None if filename is None else _text(filename)


def _text(value: bytes) -> str:
    return value.decode("utf-8", errors="replace")
