"""The only worker killed with SIGKILL mid-stream: its job waits, and a worker started later finishes it.

(A worker killed beside a live one: tests/e2e/test_stream_takeover.py.)

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
from tests.support.stack import MODEL, STACK_TIMEOUT_S

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
