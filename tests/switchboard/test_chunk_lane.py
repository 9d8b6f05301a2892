"""The lane's frames come out whole and in order however the socket cuts them; a frame no worker
sends is refused."""

from __future__ import annotations

import pytest

from switchboard.chunk_lane import (
    CHUNK,
    HEADER,
    HELLO,
    MAX_FRAME_BYTES,
    BadFrame,
    FrameReader,
    chunk_frame,
    hello,
)


def test_frames_cut_anywhere_come_out_whole_and_in_order() -> None:
    data = (
        hello("token")
        + chunk_frame(b"sb:results:j", 1, b"first", b"model")
        + chunk_frame(b"sb:results:j", 2, b"")
    )
    reader = FrameReader()
    frames = [frame for byte in range(len(data)) for frame in reader.feed(data[byte : byte + 1])]
    assert [(f.kind, f.stream_key, f.model, f.entry_id, f.body) for f in frames] == [
        (HELLO, b"", b"", b"0-0", b"token"),
        (CHUNK, b"sb:results:j", b"model", b"0-1", b"first"),
        (CHUNK, b"sb:results:j", b"", b"0-2", b""),
    ]
    assert FrameReader().feed(data) == frames


@pytest.mark.parametrize(
    "header",
    [HEADER.pack(9, 0, 0, 0, 0), HEADER.pack(CHUNK, 1, 0, 1, MAX_FRAME_BYTES + 1)],
    ids=["unknown kind", "too long"],
)
def test_a_frame_no_worker_sends_is_refused_at_its_header(header: bytes) -> None:
    with pytest.raises(BadFrame):
        FrameReader().feed(header)
