"""What `switchboard up` prints while it starts: a countdown while the engines are prepared."""

from __future__ import annotations

from pathlib import Path

from switchboard.local.start_report import StartReport, last_start_s, remember_start_s
from switchboard.readiness import ENGINES_PREPARING, NO_LIVE_WORKER, WAITING_FOR

PREPARING = WAITING_FOR[ENGINES_PREPARING]
STARTING = WAITING_FOR[NO_LIVE_WORKER]


def _shown(report_of: list[str], polls: list[tuple[float, str]], last_s: float | None) -> list[str]:
    report = StartReport(last_s, say=report_of.append)
    for elapsed_s, waiting_for in polls:
        report(elapsed_s, waiting_for)
    return report_of


def test_it_counts_down_from_the_last_start_then_says_it_takes_longer() -> None:
    polls = [(0.5, STARTING), *((s / 4, PREPARING) for s in range(4, 4 * 32))]
    shown = _shown([], polls, last_s=20.0)
    assert shown == [
        "• Preparing the engines: starting Triton, importing the engine runtime "
        "(the last start here served after 20 s)",
        "  ... about 14 s left",
        "  ... about 9 s left",
        "  ... about 4 s left",
        "  ... 21 s so far, longer than last time (20 s)",
        "  ... 26 s so far, longer than last time (20 s)",
        "  ... 31 s so far, longer than last time (20 s)",
    ]


def test_without_a_last_start_it_says_how_long_so_far_and_other_waits_every_ten_seconds() -> None:
    polls = [(s / 4, STARTING) for s in range(4 * 12)] + [(s / 4, PREPARING) for s in range(4 * 12, 4 * 18)]
    shown = _shown([], polls, last_s=None)
    assert shown == [
        f"  ... still starting (10 s: {STARTING})",
        "• Preparing the engines: starting Triton, importing the engine runtime ...",
        "  ... 17 s so far",
    ]


def test_the_last_start_is_remembered_in_the_log_folder(tmp_path: Path) -> None:
    assert last_start_s(tmp_path) is None
    remember_start_s(tmp_path, 23.46)
    assert last_start_s(tmp_path) == 23.5
    remember_start_s(tmp_path / "missing", 1.0)  # best effort: no error
    (tmp_path / "last-start-seconds").write_text("garbage")
    assert last_start_s(tmp_path) is None
