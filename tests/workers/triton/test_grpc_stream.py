"""The gRPC call over HTTP/2 on its own, against a small HTTP/2 server in the test (a unit test of one
piece: the real Triton's side is in test_client.py and test_pooling_model.py): messages cut across
frames, a window smaller than a message, the call's status, a cancel."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from workers.triton.grpc_stream import GrpcCallError, GrpcStream, open_stream

METHOD = "/test.Service/Stream"
PREFIX = struct.Struct(">BI")


def framed(message: bytes) -> bytes:
    return PREFIX.pack(0, len(message)) + message


class Server(asyncio.Protocol):
    """Answers one call: echoes each message it receives, then ends with `status` once the client
    half-closes. `window` is the stream window it grants; `frame` the most it puts in a DATA frame."""

    def __init__(self, status: bytes, window: int, frame: int) -> None:
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config)
        self.status, self.window, self.frame = status, window, frame
        self.received = bytearray()
        self.events: list[str] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.h2.initiate_connection()
        self.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: self.window})
        transport.write(self.h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        for event in self.h2.receive_data(data):
            self.events.append(type(event).__name__)
            if isinstance(event, h2.events.RequestReceived):
                self.h2.send_headers(
                    event.stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc")]
                )
            elif isinstance(event, h2.events.DataReceived):
                self.received += event.data
                self._echo(event.stream_id)
                # Opened again only as the test's window allows: one message at most in flight.
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                trailers = [(b"grpc-status", self.status), (b"grpc-message", b"told to fail")]
                self.h2.send_headers(event.stream_id, trailers, end_stream=True)
        self.transport.write(self.h2.data_to_send())

    def _echo(self, stream_id: int) -> None:
        while len(self.received) >= PREFIX.size:
            _, length = PREFIX.unpack_from(self.received)
            if len(self.received) < PREFIX.size + length:
                return
            whole = bytes(self.received[: PREFIX.size + length])
            del self.received[: PREFIX.size + length]
            for start in range(0, len(whole), self.frame):  # cut across frames on purpose
                self.h2.send_data(stream_id, whole[start : start + self.frame])


@contextlib.asynccontextmanager
async def serving(path: Path, make: Callable[[], Server]) -> AsyncIterator[list[Server]]:
    servers: list[Server] = []

    def factory() -> Server:
        servers.append(make())
        return servers[-1]

    server = await asyncio.get_running_loop().create_unix_server(factory, str(path))
    try:
        yield servers
    finally:
        server.close()


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    return tmp_path / "grpc.sock"


async def test_messages_larger_than_the_window_and_cut_across_frames_arrive_whole(socket_path: Path) -> None:
    messages = [b"a" * 100_000, b"", b"short", bytes(range(256)) * 300]
    async with serving(socket_path, lambda: Server(b"0", window=1_000, frame=777)):
        stream = await open_stream(str(socket_path), METHOD)
        for message in messages:
            stream.send(message)
        stream.end()
        answers = [answer async for answer in _read_all(stream)]
        stream.close()
    assert answers == messages


async def test_a_status_other_than_ok_ends_the_call_with_its_message(socket_path: Path) -> None:
    async with serving(socket_path, lambda: Server(b"13", window=65_535, frame=16_384)):
        stream = await open_stream(str(socket_path), METHOD)
        stream.send(b"one")
        stream.end()
        assert await stream.read() == b"one"
        with pytest.raises(GrpcCallError, match="status 13: told to fail"):
            await stream.read()
        stream.close()


async def test_close_cancels_a_call_still_open_and_a_closed_connection_ends_the_reader(
    socket_path: Path,
) -> None:
    async with serving(socket_path, lambda: Server(b"0", window=65_535, frame=16_384)) as servers:
        stream = await open_stream(str(socket_path), METHOD)
        stream.send(b"one")
        assert await stream.read() == b"one"
        reading = asyncio.create_task(stream.read())
        await asyncio.sleep(0.05)
        assert not reading.done(), "nothing more came: the reader waits"
        stream.close()
        with pytest.raises(GrpcCallError, match="cancelled"):
            await asyncio.wait_for(reading, 5)
        await asyncio.sleep(0.05)
        assert "StreamReset" in servers[0].events, "the server was told the call is cancelled"
        with pytest.raises(GrpcCallError, match="closed"):
            stream.send(b"two")


async def _read_all(stream: GrpcStream) -> AsyncIterator[bytes]:
    while (message := await stream.read()) is not None:
        yield message
