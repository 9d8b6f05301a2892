"""The only worker killed with SIGKILL mid-stream: its job waits, and a worker started later finishes it.
Then that worker's Triton and files are its user's alone; killed outright, it takes its Triton, fork
server and engine processes with it, and what it leaves on disk is removed by the next worker's start.

Both run, in this order, on the shared stack (tests/e2e/conftest.py: the demo model on one worker,
the front door), this folder's last tests, since each ends by losing its worker: the second kills
the worker the first one started. (A worker killed beside a live one:
tests/e2e/test_stream_takeover.py.)

Each test prints its figures (faults, outcomes, time to recover): `pytest -s` shows them.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from pytriton.constants import PYTRITON_HOME

from tests.support.stack import MODEL, STACK_TIMEOUT_S, Stack
from workers.runtime.private_runtime import remove_stale_runtime_dirs
from workers.triton.shm_regions import SHM_DIR, remove_stale_regions
from workers.triton.workspace import remove_stale_workspaces

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "Tell me a long story about the sea."}]
TOKENS = 300


class StreamReader(threading.Thread):
    """Reads one streamed chat completion in the background: its text, usage, finish and errors."""

    def __init__(self, base_url: str) -> None:
        super().__init__(daemon=True)
        self.base_url = base_url
        self.text = ""
        self.finish: str | None = None
        self.completion_tokens: int | None = None
        self.errors: list[Any] = []
        self.first_text = threading.Event()

    def run(self) -> None:
        body = {
            "model": MODEL,
            "messages": MESSAGES,
            "max_tokens": TOKENS,
            "min_tokens": TOKENS,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with httpx.stream("POST", f"{self.base_url}/v1/chat/completions", json=body, timeout=180) as response:
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: ") :])
                if "error" in event:
                    self.errors.append(event["error"])
                    continue
                if event.get("usage"):
                    self.completion_tokens = event["usage"]["completion_tokens"]
                for choice in event["choices"]:
                    self.text += choice["delta"].get("content") or ""
                    self.finish = choice.get("finish_reason") or self.finish
                if self.text:
                    self.first_text.set()


def test_requests_wait_for_a_worker_started_after_the_only_one_died(stack: Stack) -> None:
    stack.wait_serving(MODEL, timeout_s=STACK_TIMEOUT_S)
    reader = StreamReader(stack.base_url)
    reader.start()
    assert reader.first_text.wait(60)
    stack.workers[0].kill()
    killed_at = time.monotonic()
    stack.spawn_worker()
    reader.join(timeout=240)
    print(
        f"\nthe only worker killed; a new one finished the stream {time.monotonic() - killed_at:.1f} s later "
        f"({reader.completion_tokens} tokens, finish {reader.finish})"
    )
    assert not reader.is_alive()
    assert reader.errors == []
    assert reader.completion_tokens == TOKENS


def test_a_worker_killed_with_sigkill_leaves_no_triton_or_engine_behind(stack: Stack) -> None:
    stack.wait_serving(MODEL, timeout_s=STACK_TIMEOUT_S)
    (serving,) = [w for w in stack.workers if w.alive()]
    worker = psutil.Process(serving.process.pid)
    started = [p for p in worker.children(recursive=True) if not _is_guard(p)]
    names = " ".join(p.name() for p in started)
    assert "tritonserver" in names, names
    assert len(started) >= 3, names  # Triton, the fork server, the model's engine process
    private = _what_only_the_workers_user_can_open(worker, started)
    os.kill(worker.pid, signal.SIGKILL)  # the worker alone: nothing gets to stop anything
    _, alive = psutil.wait_procs(started, timeout=15)
    assert not alive, [(p.pid, p.name()) for p in alive]
    serving.process.wait(timeout=15)  # reaped, as its supervisor would: a zombie still holds its pid
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
    # Python-backend stubs' shared memory: none for a generator on the worker's own backend.
    regions = list(SHM_DIR.glob(f"pytrtion{worker.pid}-*"))
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
