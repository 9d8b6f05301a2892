"""What one front door allows its clients (`router.http.connections` enforces it), and the clock
a client's body is timed by.

The limits come from the router's settings, the connection cap lowered to what the process may
open. A body is timed by the client's time only: a clock that stands still while the front door
itself does not read (its flow control paused), so a client is never late for the front door's
own delay.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass

from uvicorn.protocols.http.flow_control import FlowControl

from switchboard.config import FrontDoorConfig

logger = logging.getLogger(__name__)

# File descriptors left to everything but client connections: Redis pools, logs, the exporter.
RESERVED_FDS = 64


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one front door allows its clients (router settings, the cap within the fd limit)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    body_min_rate_bytes_s: float = 1024.0
    body_rate_grace_s: float = 10.0
    body_deadline_s: float = 300.0
    send_stall_timeout_s: float = 30.0
    send_timeout_s: float = 120.0
    max_connections: int = 4096

    @classmethod
    def of(cls, router: FrontDoorConfig) -> ConnectionLimits:
        """The router's limits, with the connection cap lowered to what the process may open."""
        return cls(
            header_timeout_s=router.header_timeout_s,
            body_timeout_s=router.body_timeout_s,
            body_min_rate_bytes_s=router.body_min_rate_bytes_s,
            body_rate_grace_s=router.body_rate_grace_s,
            body_deadline_s=router.body_deadline_s,
            send_stall_timeout_s=router.send_stall_timeout_s,
            send_timeout_s=router.send_timeout_s,
            max_connections=within_fd_limit(router.max_connections),
        )

    def body_allowed_s(self, body_bytes: int) -> float:
        """How long (of the client's time) a body that has sent `body_bytes` may have taken so far:
        the grace, and 1/rate s for each byte, within the deadline."""
        if self.body_min_rate_bytes_s <= 0:
            return self.body_deadline_s
        return min(self.body_deadline_s, self.body_rate_grace_s + body_bytes / self.body_min_rate_bytes_s)


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


class ReadClock(FlowControl):
    """uvicorn's flow control, keeping count of the time reading was paused: time in which the
    front door, not its client, held a body back."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(transport)
        self._loop = loop
        self._paused_s = 0.0
        self._paused_at = 0.0

    def pause_reading(self) -> None:
        if not self.read_paused:
            self._paused_at = self._loop.time()
        super().pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self._paused_s += self._loop.time() - self._paused_at
        super().resume_reading()

    def client_time(self) -> float:
        """The loop's clock, standing still while reading is paused: the time a client is timed by."""
        now = self._loop.time()
        return now - self._paused_s - (now - self._paused_at if self.read_paused else 0.0)
