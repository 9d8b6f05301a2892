"""Child processes that are stopped together with everything they started.

A worker starts Triton and the engine's own processes. Each component is started in a process
group of its own, so that stopping it, even by force after it ignored SIGTERM, also ends the
processes it started instead of leaving them running without a parent. And each gets SIGTERM when
the process that started it dies (`with_parent`), so that a parent killed without a chance to stop
its children leaves none behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from switchboard import with_parent


def spawn_group(
    argv: Sequence[str], env: dict[str, str], *, stdout: IO[Any] | None = None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start `argv` as the leader of a new process group, ending with this process; its output goes
    to `stdout` (or ours)."""
    return subprocess.Popen(
        with_parent.wrap(list(argv)),
        env=env,
        cwd=cwd,
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout is not None else None,
        stdin=subprocess.DEVNULL,
        # Its own process group (to signal it whole), but not its own session: Linux shares CPU
        # time fairly between sessions first (autogroups), and an engine that starts on a core
        # where another session's engine is busy got almost none (a worker loading next to a
        # serving one took minutes instead of seconds on a 2-core machine).
        process_group=0,
    )


def stop_groups(processes: Sequence[subprocess.Popen[bytes]], timeout_s: float) -> list[int]:
    """SIGTERM each, wait up to `timeout_s` in all, then SIGKILL every group; returns pids killed by force."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    forced = []
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            forced.append(process.pid)
        # The group id is our own child's pid: only processes it started are in the group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return forced
