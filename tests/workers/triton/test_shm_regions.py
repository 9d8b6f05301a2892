"""Triton's shared memory regions are closed to other users whenever they appear, and removed."""

from __future__ import annotations

import stat
import time
from pathlib import Path

from workers.triton.shm_regions import IDLE_WATCH_EVERY_S, ShmRegions


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_region_made_between_loads_is_closed_within_the_idle_interval(tmp_path: Path) -> None:
    """A model's stub that Triton restarts makes a new region (mode 0644) outside any load."""
    regions = ShmRegions("pytrtion1-abc", tmp_path)
    regions.watch()
    try:
        restarted = tmp_path / "pytrtion1-abc0123-restarted"
        other = tmp_path / "pytrtion2-def0123-another-triton"
        for path in (restarted, other):
            path.write_bytes(b"a prompt")
            path.chmod(0o644)
        deadline = time.monotonic() + IDLE_WATCH_EVERY_S * 4
        while mode(restarted) != 0o600:
            assert time.monotonic() < deadline, "the region stayed readable by others"
            time.sleep(0.01)
        assert mode(other) == 0o644, "another Triton's regions are its own business"
    finally:
        regions.remove()
    assert not restarted.exists() and other.exists()


def test_during_a_load_a_new_region_is_closed_at_once(tmp_path: Path) -> None:
    regions = ShmRegions("pytrtion1-abc", tmp_path)
    regions.watch()
    try:
        with regions.kept_private():
            time.sleep(0.05)  # the watcher is in its fast pace
            region = tmp_path / "pytrtion1-abc0123-new"
            region.write_bytes(b"")
            region.chmod(0o644)
            started = time.monotonic()
            while mode(region) != 0o600:
                assert time.monotonic() - started < IDLE_WATCH_EVERY_S / 2, "not closed at the fast pace"
                time.sleep(0.001)
    finally:
        regions.remove()
