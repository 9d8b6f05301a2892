"""The Switchboard stack under the cold-start benchmark: its worker's log and when it has settled."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from servers import PROGRESS_EVERY_S
from timed_requests import Measurement, load_1m

from switchboard.local.launcher import Launcher

# The worker imports the engine runtime and starts Triton in the background after it is ready; the
# cold request is measured once that is over, as a user would meet a stack that has been running.
SETTLE_TIMEOUT_S = 180.0
IDLE_CPU_CORES = 0.15  # the worker's process tree below this, two seconds in a row, counts as idle
# Worker log lines that say where a cold request's time goes: the worker's own (its loggers are
# workers.*), and the engine process's start and end of its own work (the rest of its start is imports).
WORKER_LINES = (" workers.", "Initializing a V1 LLM engine", "init engine (profile")
WORKER_NOISE = ("still loading",)


def settle(launcher: Launcher, log: WorkerLog) -> Measurement:
    """Wait until the admin view answers, Triton has started and the worker's processes are idle."""
    load = load_1m()
    started = time.monotonic()
    worker_pid = launcher.worker_components[0].pid
    next_report = started + PROGRESS_EVERY_S
    idle_seconds = 0
    note = f"not idle after {SETTLE_TIMEOUT_S:.0f} s; measuring anyway"
    while (elapsed := time.monotonic() - started) < SETTLE_TIMEOUT_S:
        launcher.check()
        before = tree_cpu_seconds(worker_pid)
        time.sleep(1.0)
        busy = tree_cpu_seconds(worker_pid) - before > IDLE_CPU_CORES
        ready = admin_answers(launcher.base_url) and "triton started" in log.text()
        idle_seconds = idle_seconds + 1 if ready and not busy else 0
        if idle_seconds >= 2:
            note = "engine runtime imported" if "engine runtime imported" in log.text() else "idle"
            break
        if time.monotonic() >= next_report:
            print(f"    switchboard: waiting for the worker's background start ({elapsed:.0f} s)", flush=True)
            next_report += PROGRESS_EVERY_S
    return Measurement(round(time.monotonic() - started, 3), load, worker_log=log.new_lines(), note=note)


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by a process and its living descendants."""
    total = 0.0
    with contextlib.suppress(psutil.Error):
        for process in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += sum(process.cpu_times()[:2])  # user and system
    return total


def admin_get(base_url: str, path: str) -> dict[str, Any]:
    """One admin view, as JSON."""
    payload: dict[str, Any] = httpx.get(f"{base_url}{path}", timeout=10).raise_for_status().json()
    return payload


def admin_answers(base_url: str) -> bool:
    """Whether `GET /admin/models` answers."""
    try:
        admin_get(base_url, "/admin/models")
    except httpx.HTTPError:
        return False
    return True


class WorkerLog:
    """The worker's log file, and its own lines written since the last look."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def text(self) -> str:
        """Everything so far."""
        return self.path.read_text(errors="replace") if self.path.is_file() else ""

    def new_lines(self) -> list[str]:
        """The worker's own lines (not vLLM's or Triton's) completed since the last call."""
        with self.path.open("rb") as file:
            file.seek(self._offset)
            data = file.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        lines = complete.decode(errors="replace").splitlines()
        wanted = [line for line in lines if any(mark in line for mark in WORKER_LINES)]
        return [line for line in wanted if not any(noise in line for noise in WORKER_NOISE)]
