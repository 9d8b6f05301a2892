"""The front door of `front_door_path.py` as a process of its own (so that its CPU is its own), and
what the benchmark reads of it: its CPU time and its read and write system calls."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from proc_cpu import PROC, read_thread_cpu
from scripted_worker import MODEL

from switchboard.local.toml_text import toml_text
from switchboard.ports import free_port

READY_TIMEOUT_S = 60.0


@dataclass
class FrontDoorProcess:
    label: str
    process: subprocess.Popen[bytes]
    base_url: str


def start_front_door(tree: Path, label: str, redis_url: str, work_dir: Path) -> FrontDoorProcess:
    config = work_dir / f"switchboard-{label}.toml"
    config.write_text(toml_text({"models": [{"name": MODEL, "path": "/nonexistent"}]}))
    port = free_port()
    env = {**os.environ, "REDIS_URL": redis_url, "PYTHONPATH": str(tree)}
    code = "import sys; from switchboard.cli.main import main; sys.exit(main())"
    argv = [sys.executable, "-c", code, "--config", str(config), "router", "--port", str(port)]
    log = (work_dir / f"router-{label}.log").open("w")
    process = subprocess.Popen(argv, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    return FrontDoorProcess(label, process, f"http://127.0.0.1:{port}")


async def wait_ready(front_door: FrontDoorProcess, client: httpx.AsyncClient) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if front_door.process.poll() is not None:
            raise RuntimeError(f"the front door ({front_door.label}) stopped; see its router log")
        with contextlib.suppress(httpx.HTTPError):
            if (await client.get(f"{front_door.base_url}/readyz")).status_code == 200:
                return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the front door ({front_door.label}) was not ready in {READY_TIMEOUT_S:g} s")


def stop_front_door(front_door: FrontDoorProcess) -> None:
    front_door.process.terminate()
    try:
        front_door.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        front_door.process.kill()
        front_door.process.wait()


def cpu_seconds(pid: int) -> float:
    """On-CPU seconds of every live thread of `pid` (schedstat: nanoseconds, not 10 ms ticks)."""
    total = 0.0
    with contextlib.suppress(FileNotFoundError):
        for task in (PROC / str(pid) / "task").iterdir():
            if (thread := read_thread_cpu(task)) is not None:
                total += thread.cpu_s
    return total


def syscalls(pid: int) -> int:
    """Read and write system calls the process made so far (`syscr` + `syscw` of /proc/<pid>/io):
    each socket send or receive is one, so they count round trips and writes, whatever the load."""
    fields = dict(line.split(": ") for line in (PROC / str(pid) / "io").read_text().splitlines())
    return int(fields["syscr"]) + int(fields["syscw"])
