"""What `switchboard up` shows while its stack starts: what it waits for, and how long that should take.

Most of a start is the workers preparing their engines (Triton, and the engine runtime's import,
which takes tens of seconds on a busy machine). `up` says it serves only once that is done, so that
a first request is answered in seconds; meanwhile it counts down from how long the last start took
here, remembered in the log folder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from switchboard.readiness import ENGINES_PREPARING, WAITING_FOR

LAST_START_FILE = "last-start-seconds"
COUNTDOWN_EVERY_S = 5.0
STILL_STARTING_EVERY_S = 10.0


def last_start_s(log_dir: Path) -> float | None:
    """Seconds the last start from this log folder took to serve; None if unknown."""
    try:
        seconds = float((log_dir / LAST_START_FILE).read_text())
    except (OSError, ValueError):
        return None
    return seconds if seconds > 0 else None


def remember_start_s(log_dir: Path, seconds: float) -> None:
    """Keep how long this start took, for the next one's countdown (best effort)."""
    with contextlib.suppress(OSError):
        (log_dir / LAST_START_FILE).write_text(f"{seconds:.1f}\n")


class StartReport:
    """A `Launcher.wait_ready` progress callback, called on every poll; it prints now and then.

    While the engines are prepared: a line when that begins, then a countdown every few seconds.
    While waiting for anything else: what it is, every ten seconds.
    """

    def __init__(self, last_s: float | None, say: Callable[[str], None]) -> None:
        self._last_s = last_s
        self._say = say
        self._preparing_shown = False
        self._next_line_at = STILL_STARTING_EVERY_S

    def __call__(self, elapsed_s: float, waiting_for: str) -> None:
        preparing = waiting_for == WAITING_FOR[ENGINES_PREPARING]
        if preparing and not self._preparing_shown:
            self._preparing_shown = True
            self._say(
                f"• Preparing the engines: starting Triton, importing the engine runtime{self._expected()}"
            )
            self._next_line_at = elapsed_s + COUNTDOWN_EVERY_S
            return
        if elapsed_s < self._next_line_at:
            return
        if preparing:
            self._say(f"  ... {self._countdown(elapsed_s)}")
            self._next_line_at = elapsed_s + COUNTDOWN_EVERY_S
        else:
            self._say(f"  ... still starting ({elapsed_s:.0f} s: {waiting_for})")
            self._next_line_at = elapsed_s + STILL_STARTING_EVERY_S

    def _expected(self) -> str:
        if self._last_s is None:
            return " ..."
        return f" (the last start here served after {self._last_s:.0f} s)"

    def _countdown(self, elapsed_s: float) -> str:
        if self._last_s is None:
            return f"{elapsed_s:.0f} s so far"
        left_s = self._last_s - elapsed_s
        if left_s >= 1:
            return f"about {left_s:.0f} s left"
        return f"{elapsed_s:.0f} s so far, longer than last time ({self._last_s:.0f} s)"
