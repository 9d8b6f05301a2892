"""When a batch moves up from the batch tier: only once its window, less the margin, would not hold
the lines left at the pace it has run (none run yet: the margin alone decides)."""

from __future__ import annotations

import pytest

from router.batches.deadlines import Progress, behind

HOUR = 3600.0
START = 1_000_000.0


def batch(finished: int, *, total: int = 100, window_h: float = 24.0) -> Progress:
    return Progress(total=total, finished=finished, started_at=START, expires_at=START + window_h * HOUR)


@pytest.mark.parametrize(
    ("finished", "hours_in", "expected"),
    [
        (0, 0.0, False),  # nothing run yet, 24 h left: the margin (4 h) holds
        (0, 19.9, False),
        (0, 20.1, True),  # nothing run, less than the margin left
        (50, 2.0, False),  # half done in 2 h: 2 h more needed, 22 h left
        (10, 10.0, True),  # 10 lines in 10 h: 90 h needed, 14 h left
        (90, 18.0, False),  # 10 lines left at 0.2 h each: 2 h + the 4 h margin, 6 h left: it holds
        (90, 18.1, True),
        (100, 23.9, False),  # done: nothing to move up
    ],
)
def test_a_batch_moves_up_only_when_its_window_would_not_hold(
    finished: int, hours_in: float, expected: bool
) -> None:
    assert behind(batch(finished), START + hours_in * HOUR, margin_s=4 * HOUR) is expected
