"""The front door's HTTP connections, bounded against slow and greedy clients.

uvicorn's httptools protocol, with the limits it lacks (it has only a keep-alive timeout):

- **Header deadline.** A request's headers must arrive within `header_timeout_s` of its first byte
  (of a new connection's opening, for its first request); otherwise a 408 and the connection is
  closed. A slowloris that trickles headers, or never sends any, holds nothing for long.
- **Header size.** More than MAX_HEADER_BYTES before the headers end: a 431, and closed.
- **Body pauses, rate and deadline.** An upload is closed when it sends nothing for
  `body_timeout_s`, when after `body_rate_grace_s` it has averaged less than
  `body_min_rate_bytes_s` (each byte buys the client 1/rate s more: a body trickled a byte at a time
  no longer holds its connection for ever), or when it is not whole `body_deadline_s` after its
  headers. Its handler hears a disconnect, and the request counts as the client's doing (499).
  Time does not count while the front door itself is not reading (flow control paused, or a
  `100 Continue` not sent yet): the client is not late then.
- **An answer sent before its body was read** (a 401, 413, 415 or 429 given first) says
  `connection: close`; the rest of the body is read and dropped for at most LINGER_S after the
  answer, so that a client still sending sees its answer rather than a reset, and the connection is
  closed: nothing unread stays behind it.
- **Clients that stop reading.** The front door buffers nothing beyond what the kernel takes: past
  that, writing is paused (asyncio's flow control). A connection whose client takes no byte for
  `send_stall_timeout_s` while writing is paused is aborted, and the request counts as the client's
  doing (499): a stream's job is cancelled as at any disconnect. A long stream to a client that
  reads is never cut, however long it lasts. Once an answer is whole in the front door's hands
  (a stream at its end), what is left of it must be taken within `send_timeout_s` (the write
  deadline: a client that reads a byte now and then does not hold its connection for ever).
- **Connection cap.** Past `max_connections` open at once, an idle keep-alive connection is closed
  to make room; without one, the new connection is answered 503 with Retry-After at once and closed.

Between requests, the keep-alive timeout closes an idle connection. Every limit that bites is
counted (`switchboard:connections_closed`, by reason) and logged at most once per kind every few
seconds.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar, Literal

import msgspec
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from router.http.connection_limits import ConnectionLimits, ReadClock
from router.openai.errors import (
    HeadersTooLargeError,
    OpenAIError,
    RequestTimeoutError,
    TooManyConnectionsError,
)
from router.telemetry.front_door_metrics import CONNECTIONS_CLOSED, CONNECTIONS_OPEN
from router.telemetry.requests import REQUEST_ID_HEADER, new_request_id
from router.telemetry.summarized_log import SummarizedLog

logger = logging.getLogger(__name__)
_events = SummarizedLog(logger)

# Request line and headers together; more is refused (nginx reads 4 x 8 KiB, h11 16 KiB).
MAX_HEADER_BYTES = 64 * 1024
# Retry-After of a connection refused at the cap.
OVER_CAPACITY_RETRY_S = 1.0
# How long the rest of an unread body is read and dropped after its early answer (Apache lingers
# 2 s, nginx up to 30 s): long enough for a client to finish sending and read its answer.
LINGER_S = 5.0

Phase = Literal["headers", "body", "answering", "idle", "lingering"]
_json = msgspec.json.Encoder()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpProtocol]:
    """The protocol class that uvicorn's `http` setting takes, bound to `limits`; uvicorn's own
    warnings (one per malformed request) are summarized from then on too."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _SummarizedWarnings) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(_SummarizedWarnings())
    return type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"limits": limits})


class _SummarizedWarnings(logging.Filter):
    """uvicorn warns once per malformed request ("Invalid HTTP request received."), which a client
    repeats at will: its warnings go through the summarized log instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        _events.event(f"uvicorn:{record.msg}", f"uvicorn: {record.getMessage()}")
        return False


class GuardedHttpProtocol(HttpToolsProtocol):
    """One client connection, with the deadlines and the cap of the module's description."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase: Phase = "headers"
        self._timer: asyncio.TimerHandle | None = None
        self._header_bytes = 0
        self._reading: ReadClock = None  # type: ignore[assignment]  # set as the connection is made
        # The body's progress, in the client's time (`ReadClock.client_time`).
        self._body_began = 0.0  # its headers' end (or its `100 Continue`)
        self._body_seen = 0.0  # its last bytes
        self._body_bytes = 0
        # The request's own keep-alive, given back once its body is whole (until then an answer
        # closes the connection); false once the server is stopping.
        self._keep_alive_after_body = True
        # Answers: the stall deadline (writing paused), and the write deadline (an answer whole).
        self._stall_timer: asyncio.TimerHandle | None = None
        self._unsent_bytes = 0  # what the transport held when the client last took something
        self._write_deadline: asyncio.TimerHandle | None = None
        self._refused = False

    # The connection.

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections and not _close_an_idle_one(self.connections):
            self._refuse(transport)
            return
        super().connection_made(transport)
        self.flow = self._reading = ReadClock(transport, self.loop)
        # Nothing is buffered beyond what the kernel takes: any byte the client does not take pauses
        # writing, which the stall deadline watches (and a client that stops reading costs no memory).
        transport.set_write_buffer_limits(high=0)
        CONNECTIONS_OPEN.inc()
        self._arm(self.limits.header_timeout_s, self._headers_late)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return  # never counted among the connections
        self._disarm()
        self._stall_timer = _cancel(self._stall_timer)
        self._write_deadline = _cancel(self._write_deadline)
        CONNECTIONS_OPEN.dec()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused or self._phase == "lingering":
            return  # the rest of a body already answered is dropped unread
        if self._phase == "headers":
            self._header_bytes += len(data)
        super().data_received(data)
        if self._phase == "headers" and self._header_bytes > MAX_HEADER_BYTES:
            self._give_up("header_too_large", "closed connections whose request headers were too large")

    def shutdown(self) -> None:
        self._keep_alive_after_body = False  # the server stops: no request is kept alive after it
        super().shutdown()

    # The parser's steps through one request.

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._phase in ("idle", "answering"):  # a new request on a kept-alive (or pipelined) connection
            self._phase = "headers"
            self._header_bytes = 0
            self._arm(self.limits.header_timeout_s, self._headers_late)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._phase = "body"
        self._body_bytes = 0
        self._body_began = self._body_seen = self._reading.client_time()
        # An answer given before the body is whole says `connection: close`, and closing goes
        # through `_close_after_answer`, which drops the rest of the body first.
        self._keep_alive_after_body = self._keep_alive_after_body and self.cycle.keep_alive
        self.cycle.keep_alive = False
        self.cycle.transport = _AnswerTransport(self)  # type: ignore[assignment]
        self._arm(self._next_body_check(), self._body_late)

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._body_bytes += len(body)
        self._body_seen = self._reading.client_time()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if not self.cycle.response_started:
            self.cycle.keep_alive = self._keep_alive_after_body
        self._keep_alive_after_body = True
        if self.cycle.response_complete:
            self._rest()  # answered, and nothing more to read: between requests
        else:
            self._phase = "answering"
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.flow.write_paused and self._write_deadline is None:
            # The answer is whole in the front door's hands; what is left of it must be taken in time.
            self._write_deadline = self.loop.call_later(self.limits.send_timeout_s, self._send_late)
        if self._phase == "answering":
            self._rest()

    def _rest(self) -> None:
        """Between requests. uvicorn's keep-alive timer restarts with any byte (a bare CRLF, which
        begins no request, too); this deadline does not, so an idle connection ends in time."""
        self._phase = "idle"
        self._arm(self.timeout_keep_alive, self._idle_too_long)

    def _close_after_answer(self) -> None:
        """uvicorn closes the connection after an answer that said `connection: close`: at once if
        the request's body was whole; else the rest of the body is dropped for a moment first, so
        that a client still sending sees its answer rather than a reset."""
        if self._phase != "body" or self.transport.is_closing():
            self.transport.close()
            return
        CONNECTIONS_CLOSED.labels("answered_before_body").inc()
        _events.event(
            "answered_before_body",
            "closed connections answered before their request body was read (the rest dropped unread)",
            client=_address(self.client),
        )
        self._phase = "lingering"
        if self.transport.can_write_eof():
            self.transport.write_eof()  # once the answer is out: the client reads it, then the end
        self.flow.resume_reading()
        self._arm(LINGER_S, self.transport.close)

    # The answer: flow control tells when the client takes nothing.

    def pause_writing(self) -> None:
        super().pause_writing()
        self._unsent_bytes = self.transport.get_write_buffer_size()
        if self._stall_timer is None:
            self._stall_timer = self.loop.call_later(self.limits.send_stall_timeout_s, self._send_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        # All taken (the low-water mark is 0): nothing is stalled or late.
        self._stall_timer = _cancel(self._stall_timer)
        self._write_deadline = _cancel(self._write_deadline)

    def _send_stalled(self) -> None:
        self._stall_timer = None
        if not self.flow.write_paused:
            return
        unsent = self.transport.get_write_buffer_size()
        if unsent < self._unsent_bytes:  # the client took some: slow, not stopped
            self._unsent_bytes = unsent
            self._stall_timer = self.loop.call_later(self.limits.send_stall_timeout_s, self._send_stalled)
            return
        self._abort(
            "send_stall",
            f"aborted connections whose client took none of its answer for "
            f"{self.limits.send_stall_timeout_s:g} s (counted as 499: the client's doing)",
        )

    def _send_late(self) -> None:
        self._write_deadline = None
        if self.transport.get_write_buffer_size():
            self._abort(
                "send_timeout",
                f"aborted connections whose client had not taken its whole answer "
                f"{self.limits.send_timeout_s:g} s after it was written",
            )

    def _abort(self, reason: str, message: str) -> None:
        """Close at once, dropping what is unsent: the client does not take it, so a graceful close
        would wait for ever. The request's handler hears a disconnect."""
        CONNECTIONS_CLOSED.labels(reason).inc()
        _events.event(reason, message, client=_address(self.client))
        self.transport.abort()

    # The limits.

    def is_idle(self) -> bool:
        """Between requests on a kept-alive connection: closing it loses nothing."""
        return (
            self._phase == "idle"
            and not self.pipeline
            and (self.cycle is None or self.cycle.response_complete)
            and not self.transport.is_closing()
        )

    def close_idle(self) -> None:
        """Close this idle connection to make room for a new one."""
        CONNECTIONS_CLOSED.labels("idle_evicted").inc()
        _events.event("idle_evicted", "closed idle keep-alive connections to make room at the connection cap")
        self.transport.close()

    def _idle_too_long(self) -> None:
        self._timer = None
        if self._phase == "idle" and not self.transport.is_closing():
            self.transport.close()

    def _headers_late(self) -> None:
        self._timer = None
        self._give_up(
            "header_timeout",
            f"closed connections whose request headers did not arrive within "
            f"{self.limits.header_timeout_s:g} s (slow or stalled clients)",
        )

    def _next_body_check(self) -> float:
        """Seconds until the body could first be late: its pause, or its rate and deadline."""
        now = self._reading.client_time()
        pause_left = self.limits.body_timeout_s - (now - self._body_seen)
        allowed_left = self.limits.body_allowed_s(self._body_bytes) - (now - self._body_began)
        # Real time runs at least as fast as the client's: checking then is never too late.
        return max(0.01, min(pause_left, allowed_left))

    def _body_late(self) -> None:
        self._timer = None
        if self._phase != "body" or self.transport.is_closing():
            return
        now = self._reading.client_time()
        if self.cycle.waiting_for_100_continue:
            self._body_began = self._body_seen = now  # not asked for its body yet: not late
        limits = self.limits
        taken_s = now - self._body_began
        if now - self._body_seen >= limits.body_timeout_s:
            reason, why = "body_timeout", f"stopped for {limits.body_timeout_s:g} s"
        elif taken_s >= limits.body_deadline_s:
            reason, why = "body_deadline", f"was not whole {limits.body_deadline_s:g} s after its headers"
        elif taken_s >= limits.body_allowed_s(self._body_bytes):
            reason = "body_too_slow"
            why = f"came slower than {limits.body_min_rate_bytes_s:g} bytes/s past {limits.body_rate_grace_s:g} s"
        else:
            self._arm(self._next_body_check(), self._body_late)
            return
        CONNECTIONS_CLOSED.labels(reason).inc()
        _events.event(
            reason,
            f"closed connections whose request body {why} (counted as 499: the client's doing)",
            client=_address(self.client),
        )
        # The handler reading the body hears a disconnect.
        self.transport.close()

    def _give_up(self, reason: str, message: str) -> None:
        """Close the connection for `reason`, answering with its error unless a response is under way."""
        if self.transport.is_closing():
            return
        CONNECTIONS_CLOSED.labels(reason).inc()
        _events.event(reason, message, client=_address(self.client))
        self._disarm()
        # A connection that sent nothing (a browser's preconnect) is closed without a word; one in
        # the middle of a response is only closed.
        if self._header_bytes and (self.cycle is None or self.cycle.response_complete):
            error: OpenAIError
            if reason == "header_timeout":
                error = RequestTimeoutError("The request's headers did not arrive in time.")
            else:
                error = HeadersTooLargeError(
                    f"The request's headers are larger than {MAX_HEADER_BYTES} bytes."
                )
            self.transport.write(error_response(error))
        self.transport.close()

    def _refuse(self, transport: asyncio.Transport) -> None:
        self._refused = True
        CONNECTIONS_CLOSED.labels("over_capacity").inc()
        _events.event(
            "over_capacity",
            f"refused connections at the cap of {self.limits.max_connections} open connections",
        )
        transport.write(error_response(TooManyConnectionsError(OVER_CAPACITY_RETRY_S)))
        transport.close()

    def _arm(self, delay_s: float, callback: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay_s, callback)

    def _disarm(self) -> None:
        self._timer = _cancel(self._timer)


class _AnswerTransport:
    """The transport uvicorn writes one request's answer to: closing it goes through the protocol
    (`GuardedHttpProtocol._close_after_answer`), which drops a body not yet read before it closes."""

    def __init__(self, protocol: GuardedHttpProtocol) -> None:
        self._protocol = protocol
        self._transport = protocol.transport

    def write(self, data: bytes) -> None:
        self._transport.write(data)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self._protocol._close_after_answer()


def _cancel(timer: asyncio.TimerHandle | None) -> asyncio.TimerHandle | None:
    """Cancel `timer`, if any; None, for the attribute that held it."""
    if timer is not None:
        timer.cancel()
    return None


def _close_an_idle_one(connections: set[Any]) -> bool:
    """Close one idle keep-alive connection, if there is one; whether one was closed."""
    for connection in connections:
        if isinstance(connection, GuardedHttpProtocol) and connection.is_idle():
            connection.close_idle()
            return True
    return False


def error_response(error: OpenAIError) -> bytes:
    """A whole HTTP/1.1 response carrying `error` in OpenAI's shape, after which the connection closes."""
    body = _json.encode(error.body())
    headers = [
        b"content-type: application/json",
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
        # Every response carries one; a request refused before it reached the app gets one here.
        REQUEST_ID_HEADER + b": " + new_request_id().encode(),
        *(f"{name}: {value}".encode("latin-1") for name, value in error.headers.items()),
    ]
    return STATUS_LINE[error.status_code] + b"\r\n".join(headers) + b"\r\n\r\n" + body


def _address(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else ""
