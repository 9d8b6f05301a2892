"""A worker killed mid-answer: the other worker takes the job over, and the client's stream goes on.

Through every real part (openai client, front door, Redis, two worker processes with real vLLM CPU
engines on the demo model). The worker running the stream is killed with SIGKILL (everything it
started goes with it); once its heartbeat record has expired, the other worker continues the
answer after the text already sent, on the same stream. The stack is `two_workers` (in
tests/e2e/conftest.py), which the soak used before.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import openai
import pytest

from tests.support.job_workers import running_worker
from tests.support.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

PROMPT = "Once upon a time"
MAX_TOKENS = 600


def warm_replicas(stack: Stack, model: str) -> int:
    with urllib.request.urlopen(f"{stack.base_url}/admin/models/{model}", timeout=10) as response:
        status: dict[str, Any] = json.loads(response.read())
    return len([replica for replica in status["replicas"] if replica["state"] == "warm"])


def test_a_stream_whose_worker_is_killed_goes_on_from_another_worker(two_workers: Stack) -> None:
    stack = two_workers
    stack.wait_until(lambda: warm_replicas(stack, MODEL) == 2, timeout_s=600, what="both workers to hold it")
    with openai.OpenAI(
        base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=300
    ) as client:
        reference = client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0
        )
        assert reference.usage is not None and reference.usage.completion_tokens > 100, "a long answer"
        stream = client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, killed, sent_before_kill, usage, finish = "", None, "", None, None
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
            if killed is None and text:
                killed = stack.wait_until(
                    lambda: running_worker(stack, MODEL), timeout_s=30, what="the job's worker"
                )
                killed.kill()
                sent_before_kill = text
    assert killed is not None
    assert text.startswith(sent_before_kill) and len(text) > len(sent_before_kill), "it went on"
    assert finish == reference.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens >= reference.usage.completion_tokens * 0.9
    assert text == reference.choices[0].text, "the same greedy answer, seamless"
