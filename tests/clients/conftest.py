"""One live stack for every third-party client in this folder, and the answers they must agree with.

The stack is the demo model on one worker with the front door, as `switchboard up` starts it (see
tests/support/stack.py), started once for the folder. Its streamed responses hold their headers
back only briefly and send keep-alives often, so that the clients meet what a stream waiting for a
model's load sends (the cold-model check of test_vllm_bench_serve.py relies on it).

`reference` is the stack's own greedy answer to a prompt, asked with a plain HTTP request: each
client must show the same text and the same usage.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from switchboard.local.demo_model import build_demo_model, config_entry
from tests.support.stack import MODEL, Stack, running_stack

CHAT_PROMPT = "Tell me a story."
COMPLETION_PROMPT = "Once upon a time"
# Few enough to keep every test quick; enough that a wrong token shows.
MAX_TOKENS = 12
# Short, so that a request waiting for a load gets its headers and then keep-alives.
FIRST_BYTE_BUDGET_S = 0.3
LOAD_PROGRESS_EVERY_S = 0.5


@dataclass(frozen=True)
class Answer:
    """What the stack answered to one greedy request: the text and its usage."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


@pytest.fixture(scope="package")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model's folder (vLLM's benchmark reads its tokenizer from there too)."""
    return build_demo_model(tmp_path_factory.mktemp("clients-model") / "model")


@pytest.fixture(scope="package")
def stack(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, demo_model_dir: Path
) -> Iterator[Stack]:
    """Redis, one worker with the demo model loaded and answering, and the front door."""
    config = {
        "router": {
            "first_byte_budget_s": FIRST_BYTE_BUDGET_S,
            "load_progress_every_s": LOAD_PROGRESS_EVERY_S,
        },
        "models": [config_entry(demo_model_dir, preload=True)],
    }
    with running_stack(config, root=tmp_path_factory.mktemp("clients"), session=request.session) as stack:
        stack.wait_serving(MODEL)
        yield stack


@pytest.fixture(scope="package")
def base_url(stack: Stack) -> str:
    """The stack's OpenAI base URL (with `/v1`)."""
    return f"{stack.base_url}/v1"


@pytest.fixture(scope="package")
def chat_reference(base_url: str) -> Answer:
    """The stack's greedy chat answer to CHAT_PROMPT, asked without any SDK."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": CHAT_PROMPT}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    reply = httpx.post(f"{base_url}/chat/completions", json=body, timeout=120).json()
    choice = reply["choices"][0]
    return _answer(choice["message"]["content"], reply["usage"], choice["finish_reason"])


@pytest.fixture(scope="package")
def completion_reference(base_url: str) -> Answer:
    """The stack's greedy completion of COMPLETION_PROMPT, asked without any SDK."""
    body = {"model": MODEL, "prompt": COMPLETION_PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
    reply = httpx.post(f"{base_url}/completions", json=body, timeout=120).json()
    choice = reply["choices"][0]
    return _answer(choice["text"], reply["usage"], choice["finish_reason"])


def _answer(text: str, usage: dict[str, int], finish_reason: str) -> Answer:
    assert text, "the demo model answers with some text"
    return Answer(text, usage["prompt_tokens"], usage["completion_tokens"], finish_reason)
