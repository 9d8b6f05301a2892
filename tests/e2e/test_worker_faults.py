"""Workers killed with SIGKILL mid-stream: their jobs are taken over and their clients answered.

Each test prints its figures (faults, outcomes, time to recover): `pytest -s` shows them.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from switchboard.local.demo_model import config_entry
from tests.e2e.conftest import MODEL, STACK_TIMEOUT_S, Stack

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "Tell me a long story about the sea."}]
TOKENS = 300
FAST_HEARTBEAT = {"SWITCHBOARD_WORKER__HEARTBEAT_S": "0.5"}


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


def worker_running_the_job(stack: Stack) -> int:
    """Which of the stack's workers holds the one running job (by the pid in its worker id)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = httpx.get(f"{stack.base_url}/admin/models/{MODEL}", timeout=10).json()
        busy = [replica["worker_id"] for replica in status["replicas"] if replica["in_flight"]]
        if busy:
            pid = int(busy[0].split("-")[-2])
            return next(i for i, worker in enumerate(stack.workers) if worker.pid == pid)
        time.sleep(0.2)
    raise AssertionError("no worker reported the job in flight")


def test_a_stream_survives_its_worker_killed_mid_answer(start_stack: Any, demo_model_dir: Path) -> None:
    config = {"models": [config_entry(demo_model_dir, preload=True, min_replicas=2)]}
    with start_stack(config, workers=2, env=FAST_HEARTBEAT) as stack:
        stack.wait_until(
            lambda: (
                sum(
                    r["state"] == "warm"
                    for r in httpx.get(f"{stack.base_url}/admin/models/{MODEL}", timeout=10).json()[
                        "replicas"
                    ]
                )
                == 2
            ),
            timeout_s=STACK_TIMEOUT_S,
            what="both workers to hold the model",
        )
        reader = StreamReader(stack.base_url)
        reader.start()
        assert reader.first_text.wait(60)
        victim = worker_running_the_job(stack)
        before = reader.text
        killed_at = time.monotonic()
        stack.workers[victim].kill()
        reader.join(timeout=150)
        recovered_s = time.monotonic() - killed_at
        print(
            f"\nkilled worker {victim + 1} of 2 after {len(before)} characters; stream ended "
            f"{recovered_s:.1f} s later with {reader.completion_tokens} tokens, finish {reader.finish}"
        )
        assert not reader.is_alive(), "the stream never ended"
        assert reader.errors == []
        assert reader.text.startswith(before) and len(reader.text) > len(before)
        assert reader.finish == "length"
        assert reader.completion_tokens == TOKENS


def test_requests_wait_for_a_worker_started_after_the_only_one_died(
    start_stack: Any, demo_model_dir: Path
) -> None:
    config = {"models": [config_entry(demo_model_dir, preload=True)]}
    with start_stack(config, env=FAST_HEARTBEAT) as stack:
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
