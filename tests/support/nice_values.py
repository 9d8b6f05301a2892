"""The CPU priority (nice value) a process's threads compute at, as the engine priorities set it."""

from __future__ import annotations

import os


def process_nice(pid: int) -> list[int]:
    """The nice value of every thread of process `pid` (Linux keeps one per thread)."""
    return [os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir(f"/proc/{pid}/task")]
