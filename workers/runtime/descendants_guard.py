"""A worker's processes end with it: `python -m workers.runtime.descendants_guard WORKER_PID`.

A worker starts Triton, a fork server and one engine process per model, and stops them all when it
stops. Killed outright (SIGKILL, the OOM killer), it stops nothing: Triton would go on holding its
ports, and the engines their memory, for nobody. This small process watches the worker: every
moment it notes the worker's descendants, and when the worker is gone it kills the ones it last
saw. It is started by the worker itself (`start`), asks Linux for SIGTERM when the worker dies, and
also checks its parent every POLL_S, so it acts within a fraction of a second either way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil

from switchboard.with_parent import ask_for_signal_when_parent_dies

POLL_S = 0.5


def start() -> subprocess.Popen[bytes]:
    """Start the guard of this process (the worker); it ends by itself after the worker."""
    return subprocess.Popen([sys.executable, "-m", __name__, str(os.getpid())], stdin=subprocess.DEVNULL)


def guard(worker_pid: int) -> None:
    """Note the worker's descendants until it is gone, then kill those noted."""
    worker = psutil.Process(worker_pid)
    seen: list[psutil.Process] = []
    parent_gone = False

    def on_term(*_: object) -> None:
        nonlocal parent_gone
        parent_gone = True

    signal.signal(signal.SIGTERM, on_term)
    while not parent_gone and os.getppid() == worker_pid:
        with contextlib.suppress(psutil.Error):
            seen = [p for p in worker.children(recursive=True) if p.pid != os.getpid()]
        time.sleep(POLL_S)
    _kill(seen)


def _kill(processes: list[psutil.Process]) -> None:
    for process in processes:
        # psutil refuses to signal a pid that now belongs to another process (it checks start times).
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(processes, timeout=5)


if __name__ == "__main__":
    ask_for_signal_when_parent_dies(signal.SIGTERM)
    guard(int(sys.argv[1]))
