"""Log lines for events that an attacker can repeat at will: the first at once, then a count.

A front door under a slowloris closes thousands of connections a minute; one warning each would
drown the log (and cost more than the attack). For each kind of event the first is logged as it
happens; those within the next `every_s` are counted and logged as one line when that window ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class _Window:
    """One kind of event: when it was last logged, and how many happened since."""

    logged_at: float
    message: str
    extra: dict[str, Any]
    since: int = 0
    flush: asyncio.TimerHandle | None = field(default=None)
    flush_loop: asyncio.AbstractEventLoop | None = field(default=None)


class SummarizedLog:
    """Log lines of events that repeat, at most one per kind every `every_s` seconds."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0, level: int = logging.WARNING) -> None:
        self._logger = logger
        self._every_s = every_s
        self._level = level
        self._windows: dict[str, _Window] = {}

    def event(self, kind: str, message: str, **extra: Any) -> None:
        """One `kind` event; `message` says what happened (the count is added by the summary line)."""
        now = time.monotonic()
        window = self._windows.get(kind)
        if window is None or (window.since == 0 and now - window.logged_at >= self._every_s):
            self._windows[kind] = _Window(logged_at=now, message=message, extra=extra)
            self._logger.log(self._level, message, extra={"event": kind, **extra})
            return
        window.since += 1
        window.message, window.extra = message, extra
        if window.flush is not None and window.flush_loop is not None and window.flush_loop.is_closed():
            window.flush = None  # scheduled on a loop that has ended (one per test): never runs
        if window.flush is None:
            delay = max(0.0, window.logged_at + self._every_s - now)
            window.flush = _call_later(delay, self._flush, kind)
            window.flush_loop = _running_loop()

    def _flush(self, kind: str) -> None:
        window = self._windows[kind]
        count, window.since, window.flush = window.since, 0, None
        window.logged_at = time.monotonic()
        self._logger.log(
            self._level,
            f"{window.message} ({count} more like it in the last {self._every_s:g} s)",
            extra={"event": kind, "count": count, **window.extra},
        )


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _call_later(delay: float, callback: Any, *args: Any) -> asyncio.TimerHandle | None:
    """Schedule on the running loop; outside one (tests of one piece), nothing is summarized later."""
    loop = _running_loop()
    return loop.call_later(delay, callback, *args) if loop is not None else None
