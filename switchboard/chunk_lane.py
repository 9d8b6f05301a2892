"""The frames of the lane from a worker to a front door on the same machine (`router.queue.lane`).

A worker's chunk reaches its front door through Redis: the append script writes it to the job's
result stream and copies it to the front door's inbox, whose blocked XREAD returns it. A front door
also listens on a Unix socket, and a worker on the same machine sends each chunk there first
(`workers.jobs.lane`): one hop instead of two. This module is what both ends agree on: where the
socket is (`LaneAddress`, in `keys.router_lane`) and the frames on it.

A frame is a header (`HEADER`: kind, lengths, the chunk's position) and its parts. The first frame
of a connection is `HELLO` with the address's token: a front door reads nothing else from a
connection that has not said it. Then `CHUNK` frames: the job's result stream key, the chunk's
position (its entry id there is `0-<position>`, `switchboard/lua/append_chunk.lua`), the model
that serves the job on the writer's first chunk (empty otherwise) and the encoded chunk.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import msgspec

HELLO = 1
CHUNK = 2
# kind, stream key length, model length, position, chunk length
HEADER = struct.Struct("<BHHII")
# A frame longer than this is not a worker's: the connection is closed.
MAX_FRAME_BYTES = 64 * 1024 * 1024


class LaneAddress(msgspec.Struct, frozen=True):
    """Where a front door takes chunks: its socket, and the token a connection must say first."""

    path: str
    token: str


lane_address_decoder = msgspec.json.Decoder(LaneAddress)


class BadFrame(ValueError):
    """A frame no worker sends: an unknown kind, or longer than MAX_FRAME_BYTES."""


@dataclass(frozen=True)
class Frame:
    kind: int
    stream_key: bytes
    model: bytes
    position: int
    body: bytes  # the chunk (CHUNK) or the token (HELLO)

    @property
    def entry_id(self) -> bytes:
        """The chunk's entry id in its result stream."""
        return b"0-%d" % self.position


def hello(token: str) -> bytes:
    """The first frame of a connection."""
    body = token.encode()
    return HEADER.pack(HELLO, 0, 0, 0, len(body)) + body


def chunk_frame(stream_key: bytes, position: int, chunk: bytes, model: bytes = b"") -> bytes:
    """A chunk at `position` (entry `0-<position>`) of the result stream `stream_key`."""
    header = HEADER.pack(CHUNK, len(stream_key), len(model), position, len(chunk))
    return b"".join((header, stream_key, model, chunk))


class FrameReader:
    """Cuts the bytes of a connection into frames, whatever pieces they arrive in."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        """The frames completed by `data`; BadFrame for one that no worker sends."""
        self._buffer += data
        frames: list[Frame] = []
        start = 0
        while len(self._buffer) - start >= HEADER.size:
            kind, key_length, model_length, position, body_length = HEADER.unpack_from(self._buffer, start)
            if kind not in (HELLO, CHUNK) or body_length > MAX_FRAME_BYTES:
                raise BadFrame(f"a frame of kind {kind} and {body_length} bytes")
            end = start + HEADER.size + key_length + model_length + body_length
            if len(self._buffer) < end:
                break
            at = start + HEADER.size
            key = bytes(self._buffer[at : at + key_length])
            at += key_length
            model = bytes(self._buffer[at : at + model_length])
            at += model_length
            frames.append(Frame(kind, key, model, position, bytes(self._buffer[at:end])))
            start = end
        del self._buffer[:start]
        return frames
