"""Whether a batch's window will hold at the pace it runs (pure: no Redis, no clock).

A batch's lines wait in the batch tier, which takes only slots no interactive job wants, and which
neither loads a model nor keeps one warm. That is right while the window has room; it is wrong for a
batch on a model nobody else uses, or on a fleet that stays busy, which would never finish. So the
runner asks, every pass, whether the time left is below the margin plus the time the remaining lines
would take at the pace seen so far (none seen yet: the margin alone); a batch that is behind moves up
to the flex tier, whose waiting jobs load their models like any request's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Progress:
    """A running batch as the runner sees it."""

    total: int
    finished: int
    # Unix times: when its lines began to run, and when its window ends.
    started_at: float
    expires_at: float


def behind(progress: Progress, now: float, margin_s: float) -> bool:
    """Whether the batch must move up to keep its window: the time left is less than `margin_s` plus
    what its remaining lines would take at its pace so far."""
    left_s = progress.expires_at - now
    remaining = progress.total - progress.finished
    if remaining <= 0:
        return False
    elapsed_s = max(0.0, now - progress.started_at)
    needed_s = remaining * elapsed_s / progress.finished if progress.finished > 0 else 0.0
    return left_s < margin_s + needed_s
