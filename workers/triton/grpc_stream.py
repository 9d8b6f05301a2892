"""One bidirectional gRPC call to the worker's Triton, spoken over HTTP/2 on the worker's event loop.

gRPC's own asyncio client writes each message from the caller's thread inside its C core, holding
the GIL through the `sendmsg` that wakes tritonserver; on a busy machine the kernel may switch to
the woken process right there, and every other thread of the worker (the engine's loop among them)
waits for the GIL meanwhile. Profiled with the GIL's holder sampled at 32 streams, that send was
12 % of the worker's Python time. Its responses came back through gRPC's poller thread, a wake-up
more for each. Here the call is HTTP/2 frames (the `h2` library) on an asyncio connection: a write
is a plain socket send, which lets the GIL go, and a response is read on the loop that awaits it.

Only what Triton's stream needs: one call per connection, messages uncompressed, the server's
status from its trailers. Flow control is honoured both ways: a message larger than Triton's window
waits for it to open, and what is read is acknowledged as it is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections import deque

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

# A gRPC message on the wire: a compressed flag (always 0 here), its length, then its bytes.
_PREFIX = struct.Struct(">BI")
# What this side lets Triton send before it acknowledges: a response may be a large batch of
# embeddings, and acknowledging in small steps would cost a round of frames for each.
RECEIVE_WINDOW = 2**24
# gRPC's status "OK", as its trailer carries it.
_GRPC_OK = b"0"


class GrpcCallError(RuntimeError):
    """The call ended with a status other than OK, or its connection broke."""


class GrpcStream(asyncio.Protocol):
    """One bidirectional streaming call on a connection of its own (`open_stream` opens it)."""

    def __init__(self, path: str) -> None:
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self._h2 = h2.connection.H2Connection(config)
        self._path = path
        self._transport: asyncio.Transport | None = None
        self._call_id = 0
        self._outgoing = bytearray()
        self._end_asked = False  # end() was called: no more sends
        self._end_sent = False
        self._incoming = bytearray()
        self._messages: deque[bytes] = deque()
        self._arrived: asyncio.Future[None] | None = None
        self._status: bytes | None = None
        self._status_message = b""
        self._ended: BaseException | None = None  # set once the call is over, OK or not
        self._finished = False

    # --- what a caller uses --------------------------------------------------------------------

    def send(self, message: bytes) -> None:
        """Send one message (at once, or as soon as Triton's window lets it)."""
        if self._end_asked or self._finished or self._ended is not None:
            raise GrpcCallError("the call's sending side is closed")
        self._outgoing += _PREFIX.pack(0, len(message))
        self._outgoing += message
        self._pump()

    def end(self) -> None:
        """No more messages (a half-close): Triton ends the call once it has answered them all."""
        self._end_asked = True
        self._pump()

    async def read(self) -> bytes | None:
        """The next message from Triton; None once the call ended with OK. Raises GrpcCallError."""
        while not self._messages:
            if self._ended is not None:
                if isinstance(self._ended, _EndedOk):
                    return None
                raise self._ended
            self._arrived = asyncio.get_running_loop().create_future()
            try:
                await self._arrived
            finally:
                self._arrived = None
        return self._messages.popleft()

    def close(self) -> None:
        """Cancel the call unless it has ended, and close the connection."""
        self._end(GrpcCallError("the call was cancelled"))
        if self._transport is None or self._transport.is_closing():
            return
        if not self._finished:
            with contextlib.suppress(Exception):
                self._h2.reset_stream(self._call_id, h2.errors.ErrorCodes.CANCEL)
                self._transport.write(self._h2.data_to_send())
        self._transport.close()

    # --- asyncio's side ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._h2.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: RECEIVE_WINDOW}
        )
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(RECEIVE_WINDOW)
        self._call_id = self._h2.get_next_available_stream_id()
        self._h2.send_headers(
            self._call_id,
            [
                (b":method", b"POST"),
                (b":scheme", b"http"),
                (b":path", self._path.encode()),
                (b":authority", b"localhost"),
                (b"te", b"trailers"),
                (b"content-type", b"application/grpc"),
            ],
        )
        transport.write(self._h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._end(GrpcCallError(f"Triton's HTTP/2 broke the protocol: {exc}"))
            self.close()
            return
        for event in events:
            self._on_event(event)
        if self._transport is not None and not self._transport.is_closing():
            self._pump()  # answers pings and settings, and sends what a window update let through

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(GrpcCallError(f"the connection to Triton closed: {exc or 'by Triton'}"))

    # --- the call ------------------------------------------------------------------------------

    def _on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.DataReceived):
            if event.data:
                self._incoming += event.data
                self._take_messages()
            self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
            self._note_headers(event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            self._finished = True
            if self._status == _GRPC_OK:
                self._end(_EndedOk())
            else:
                status = (self._status or b"none").decode()
                message = self._status_message.decode(errors="replace")
                self._end(GrpcCallError(f"Triton ended the call with status {status}: {message}"))
        elif isinstance(event, h2.events.StreamReset):
            self._finished = True
            self._end(GrpcCallError(f"Triton reset the call (HTTP/2 error {event.error_code})"))
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._finished = True
            self._end(GrpcCallError(f"Triton ended the connection (HTTP/2 error {event.error_code})"))

    def _note_headers(self, headers: list[tuple[bytes, bytes]]) -> None:
        for name, value in headers:
            if name == b"grpc-status":
                self._status = value
            elif name == b"grpc-message":
                self._status_message = value
            elif name == b":status" and value != b"200":
                self._status, self._status_message = b"http " + value, b"not a gRPC answer"

    def _take_messages(self) -> None:
        buffer = self._incoming
        start = 0
        while len(buffer) - start >= _PREFIX.size:
            compressed, length = _PREFIX.unpack_from(buffer, start)
            if len(buffer) - start - _PREFIX.size < length:
                break
            body = start + _PREFIX.size
            if compressed:
                self._end(GrpcCallError("Triton sent a compressed message, which was not asked for"))
                return
            self._messages.append(bytes(buffer[body : body + length]))
            start = body + length
        del buffer[:start]
        if self._messages:
            self._wake()

    def _pump(self) -> None:
        """Send what the windows allow (and the half-close once all is sent), then flush."""
        if self._transport is None or self._transport.is_closing():
            return
        if not self._finished:
            while self._outgoing:
                size = min(
                    len(self._outgoing),
                    self._h2.local_flow_control_window(self._call_id),
                    self._h2.max_outbound_frame_size,
                )
                if size <= 0:
                    break  # the rest goes when Triton opens its window (a WindowUpdated)
                self._h2.send_data(self._call_id, bytes(self._outgoing[:size]))
                del self._outgoing[:size]
            if self._end_asked and not self._end_sent and not self._outgoing:
                with contextlib.suppress(h2.exceptions.StreamClosedError):
                    self._h2.end_stream(self._call_id)
                self._end_sent = True
        if data := self._h2.data_to_send():
            self._transport.write(data)

    def _end(self, why: BaseException) -> None:
        if self._ended is None:
            self._ended = why
        self._wake()

    def _wake(self) -> None:
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)


class _EndedOk(Exception):
    """The call ended with status OK (kept where an error would be)."""


async def open_stream(socket_path: str, method: str) -> GrpcStream:
    """Open a connection to Triton's gRPC socket and start the call `method` ("/package.Service/Method")."""
    loop = asyncio.get_running_loop()
    _, stream = await loop.create_unix_connection(lambda: GrpcStream(method), socket_path)
    return stream
