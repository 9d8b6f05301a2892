"""The front door's HTTP connections, bounded against slow and greedy clients.

uvicorn's httptools protocol, with the limits it lacks (it has only a keep-alive timeout):

- **Header deadline.** A request's headers must arrive within `header_timeout_s` of its first byte
  (of a new connection's opening, for its first request); otherwise a 408 and the connection is
  closed. A slowloris that trickles headers, or never sends any, holds nothing for long.
- **Header size.** More than MAX_HEADER_BYTES before the headers end: a 431, and closed.
- **Body pauses.** An upload that sends nothing for `body_timeout_s` is closed: its handler hears a
  disconnect, and the request counts as the client's doing (499). Time does not count while the
  front door itself is not reading (flow control paused, or a `100 Continue` not sent yet).
- **Connection cap.** Past `max_connections` open at once, an idle keep-alive connection is closed
  to make room; without one, the new connection is answered 503 with Retry-After at once and closed.

Nothing is timed while a response is sent, so a long SSE stream is never cut; between requests,
the keep-alive timeout closes an idle connection. Every limit that bites is counted
(`switchboard:connections_closed`) and logged at most once per kind every few seconds.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import msgspec
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from router.openai.errors import (
    HeadersTooLargeError,
    OpenAIError,
    RequestTimeoutError,
    TooManyConnectionsError,
)
from router.telemetry.metrics import CONNECTIONS_CLOSED, CONNECTIONS_OPEN
from router.telemetry.requests import REQUEST_ID_HEADER, new_request_id
from router.telemetry.summarized_log import SummarizedLog
from switchboard.router_config import RouterConfig

logger = logging.getLogger(__name__)
_events = SummarizedLog(logger)

# Request line and headers together; more is refused (nginx reads 4 x 8 KiB, h11 16 KiB).
MAX_HEADER_BYTES = 64 * 1024
# File descriptors left to everything but client connections: Redis pools, logs, the exporter.
RESERVED_FDS = 64
# Retry-After of a connection refused at the cap.
OVER_CAPACITY_RETRY_S = 1.0

Phase = Literal["headers", "body", "answering", "idle"]
_json = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one front door allows its clients (router settings, the cap within the fd limit)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 4096

    @classmethod
    def of(cls, router: RouterConfig) -> ConnectionLimits:
        """The router's limits, with the connection cap lowered to what the process may open."""
        return cls(
            header_timeout_s=router.header_timeout_s,
            body_timeout_s=router.body_timeout_s,
            max_connections=within_fd_limit(router.max_connections),
        )


def within_fd_limit(max_connections: int) -> int:
    """`max_connections`, or fewer where the process's file-descriptor limit would run out first
    (then the front door would stop accepting anyone, which is what the cap is there to prevent)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft - RESERVED_FDS >= max_connections:
        return max_connections
    allowed = max(1, soft - RESERVED_FDS)
    logger.warning(
        f"router.max_connections lowered to {allowed}: the process may open only {soft} files "
        "(raise `ulimit -n` to allow more)",
        extra={"configured": max_connections, "allowed": allowed, "nofile": soft},
    )
    return allowed


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
        self._body_seen = 0.0  # loop time of the last body bytes (or of the headers' end)
        self._refused = False

    # The connection.

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections and not _close_an_idle_one(self.connections):
            self._refuse(transport)
            return
        super().connection_made(transport)
        CONNECTIONS_OPEN.inc()
        self._arm(self.limits.header_timeout_s, self._headers_late)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return  # never counted among the connections
        self._disarm()
        CONNECTIONS_OPEN.dec()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._phase == "headers":
            self._header_bytes += len(data)
        super().data_received(data)
        if self._phase == "headers" and self._header_bytes > MAX_HEADER_BYTES:
            self._give_up("header_too_large", "closed connections whose request headers were too large")

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
        self._body_seen = self.loop.time()
        self._arm(self.limits.body_timeout_s, self._body_stalled)

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._body_seen = self.loop.time()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self.cycle is not None and self.cycle.response_complete:
            self._rest()  # answered before the body was all in (a 413): nothing more to send
        else:
            self._phase = "answering"
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._phase == "answering":
            self._rest()

    def _rest(self) -> None:
        """Between requests. uvicorn's keep-alive timer restarts with any byte (a bare CRLF, which
        begins no request, too); this deadline does not, so an idle connection ends in time."""
        self._phase = "idle"
        self._arm(self.timeout_keep_alive, self._idle_too_long)

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

    def _body_stalled(self) -> None:
        self._timer = None
        if self._phase != "body" or self.transport.is_closing():
            return
        now = self.loop.time()
        if self.flow.read_paused or (self.cycle is not None and self.cycle.waiting_for_100_continue):
            self._body_seen = now  # the front door is not reading: the client is not late
        waited = now - self._body_seen
        if waited < self.limits.body_timeout_s:
            self._arm(self.limits.body_timeout_s - waited, self._body_stalled)
            return
        CONNECTIONS_CLOSED.labels("body_timeout").inc()
        _events.event(
            "body_timeout",
            f"closed connections whose request body stopped for {self.limits.body_timeout_s:g} s "
            "(counted as 499: the client's doing)",
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
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


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
