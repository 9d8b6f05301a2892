"""The real stack for end-to-end tests: Redis, one worker process (PyTriton + vLLM), the front door.

Started once for this folder and shared, because the engine takes a minute or two to start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import AsyncOpenAI, OpenAI

from switchboard.config import DEMO_MODEL_NAME
from switchboard.demo_model import build_demo_model
from switchboard.ports import free_port
from switchboard.processes import spawn_group, stop_groups
from switchboard.redis_server import PrivateRedis

READY_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 60.0


class Stack:
    """Where the end-to-end stack listens, and its processes' logs."""

    def __init__(self, base_url: str, redis: PrivateRedis, logs: Path) -> None:
        self.base_url = base_url
        self.redis = redis
        self.logs = logs


def _spawn(command: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return spawn_group([sys.executable, "-m", "switchboard", command], env, stdout=out)


def _wait_ready(url: str, processes: list[subprocess.Popen[bytes]], logs: Path) -> None:
    started = time.monotonic()
    last_report = started
    while time.monotonic() - started < READY_TIMEOUT_S:
        for process in processes:
            if process.poll() is not None:
                pytest.fail(f"{process.args[-1]} exited with {process.returncode}; logs in {logs}")  # type: ignore[index]
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() - last_report > 15:
            last_report = time.monotonic()
            print(
                f"waiting for the worker to load the engine ({last_report - started:.0f} s)", file=sys.stderr
            )
        time.sleep(0.5)
    pytest.fail(f"the stack was not ready within {READY_TIMEOUT_S:.0f} s; logs in {logs}")


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    forced = stop_groups(processes, timeout_s=STOP_TIMEOUT_S)
    # A component that ignores SIGTERM is a bug worth failing for, not only a slow teardown.
    assert not forced, f"processes {forced} did not stop on SIGTERM within {STOP_TIMEOUT_S:.0f} s"


def _print_logs_if_failed(session: pytest.Session, logs: Path) -> None:
    """A failing end-to-end test is explained by the worker's and router's logs: show their ends."""
    if not session.testsfailed:
        return
    for log in sorted(logs.glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-40:]
        print(f"\n----- last lines of {log} -----", *tail, sep="\n", file=sys.stderr)


# Package scope: the engine stops when the end-to-end tests are done, so its busy compute
# threads do not slow the rest of the suite.
@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """Redis, a worker serving the demo model, and the front door, all real processes."""
    root = tmp_path_factory.mktemp("e2e")
    model_dir = root / "demo-model"
    build_demo_model(model_dir)
    port = free_port()
    with PrivateRedis() as redis:
        env = {
            **os.environ,
            "REDIS_URL": redis.url,
            "SWITCHBOARD_WORKER__DEMO_MODEL_DIR": str(model_dir),
            "SWITCHBOARD_ROUTER__PORT": str(port),
            "SWITCHBOARD_ROUTER__HOST": "127.0.0.1",
            "SWITCHBOARD_WORKER__DRAIN_TIMEOUT_S": "5",
        }
        processes = [_spawn("worker", env, root / "worker.log"), _spawn("router", env, root / "router.log")]
        try:
            _wait_ready(f"http://127.0.0.1:{port}/readyz", processes, root)
            yield Stack(f"http://127.0.0.1:{port}", redis, root)
        finally:
            _stop(list(reversed(processes)))
            _print_logs_if_failed(request.session, root)


@pytest.fixture
def client(stack: Stack) -> Iterator[OpenAI]:
    """The official openai client pointed at the front door."""
    with OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=120) as openai:
        yield openai


@pytest.fixture
async def async_client(stack: Stack) -> AsyncOpenAI:
    """The official async openai client pointed at the front door."""
    return AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


MODEL = DEMO_MODEL_NAME
