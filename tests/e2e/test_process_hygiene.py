"""A worker killed outright takes its Triton, fork server and engine processes with it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from switchboard.local.demo_model import config_entry
from tests.support.stack import MODEL, STACK_TIMEOUT_S

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
        os.kill(worker.pid, signal.SIGKILL)  # the worker alone: nothing gets to stop anything
        _, alive = psutil.wait_procs(started, timeout=15)
        assert not alive, [(p.pid, p.name()) for p in alive]


def _is_guard(process: psutil.Process) -> bool:
    try:
        return "descendants_guard" in " ".join(process.cmdline())
    except psutil.ZombieProcess:
        return True  # a guard that was killed and not yet reaped
