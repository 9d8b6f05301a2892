"""A worker's Triton and files are its user's alone; killed outright, it takes its Triton, fork server
and engine processes with it, and what it leaves on disk is removed by the next worker's start."""

from __future__ import annotations

import os
import signal
import stat
import tempfile
from pathlib import Path

import psutil
import pytest
from pytriton.constants import PYTRITON_HOME

from switchboard.local.demo_model import config_entry
from tests.support.stack import MODEL, STACK_TIMEOUT_S
from workers.runtime.private_runtime import remove_stale_runtime_dirs
from workers.triton.shm_regions import SHM_DIR, remove_stale_regions
from workers.triton.workspace import remove_stale_workspaces

pytestmark = pytest.mark.e2e


def test_a_worker_killed_with_sigkill_leaves_no_triton_or_engine_behind(
    start_stack: object, demo_model_dir: Path
) -> None:
    config = {"models": [config_entry(demo_model_dir, preload=True)]}
    with start_stack(config) as stack:  # type: ignore[operator]
        stack.wait_serving(MODEL, timeout_s=STACK_TIMEOUT_S)
        worker = psutil.Process(stack.workers[0].process.pid)
        started = [p for p in worker.children(recursive=True) if not _is_guard(p)]
        names = " ".join(p.name() for p in started)
        assert "tritonserver" in names, names
        assert len(started) >= 3, names  # Triton, the fork server, the model's engine process
        private = _what_only_the_workers_user_can_open(worker, started)
        os.kill(worker.pid, signal.SIGKILL)  # the worker alone: nothing gets to stop anything
        _, alive = psutil.wait_procs(started, timeout=15)
        assert not alive, [(p.pid, p.name()) for p in alive]
    # What it left is known as a dead worker's, and the next worker's start removes it.
    assert all(path.exists() for path in private)
    remove_stale_regions()
    remove_stale_runtime_dirs()
    remove_stale_workspaces()
    assert not any(path.exists() for path in private), private


def _what_only_the_workers_user_can_open(worker: psutil.Process, started: list[psutil.Process]) -> list[Path]:
    """Triton takes no token on its command line and listens on no TCP port but its metrics one; the
    prompts' shared memory, the sockets' folders and PyTriton's workspace are private. Returns them."""
    (triton,) = [p for p in started if p.name() == "tritonserver"]
    command_line = Path(f"/proc/{triton.pid}/cmdline").read_bytes()
    assert b"access-token" not in command_line and b"restricted" not in command_line, command_line
    listening = [c.laddr for c in triton.net_connections("inet") if c.status == "LISTEN"]
    assert len(listening) == 1 and listening[0].ip == "127.0.0.1", listening  # its metrics
    regions = list(SHM_DIR.glob(f"pytrtion{worker.pid}-*"))
    assert regions, "the model's stub has its region"
    folders = list(Path(tempfile.gettempdir()).glob(f"switchboard-{worker.pid}-*"))
    assert {folder.name.split("-")[2] for folder in folders} == {"triton", "ipc"}, folders
    (vllm_sockets,) = [folder for folder in folders if "-ipc-" in folder.name]
    assert any(path.is_socket() for path in vllm_sockets.iterdir()), "vLLM's sockets are in the worker's"
    for path in regions:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    workspaces = list(Path(PYTRITON_HOME).glob(f"sb{worker.pid}-*"))
    assert len(workspaces) == 1, workspaces  # PyTriton's: the stubs' sockets, a copy of Triton
    for path in [*folders, *workspaces]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    return [*regions, *folders, *workspaces]


def _is_guard(process: psutil.Process) -> bool:
    try:
        return "descendants_guard" in " ".join(process.cmdline())
    except psutil.ZombieProcess:
        return True  # a guard that was killed and not yet reaped
