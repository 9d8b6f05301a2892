"""The stock `vllm bench serve` (vLLM's load generator, from the project's own environment) against a
live stack with no proxy in between: chat and completions, every request answered.

Its stream parser is strict: it strips a leading `data: ` from each event and decodes the rest as
JSON, skips only events that begin with `:`, and reads whatever each network read brings. The
completions run begins with one request to a model an operator has just unloaded: that request
waits for the load behind keep-alives, and the benchmark's first request (its "initial test run",
tried once here) must parse, or the whole run stops.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.clients.conftest import FIRST_BYTE_BUDGET_S
from tests.support.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

VLLM = Path(sys.executable).parent / "vllm"
PROMPTS = 32
CONCURRENCY = 8
INPUT_LEN = 32
OUTPUT_LEN = 16
# Far below what this machine does (about 1,700 output tokens/s at concurrency 8), far above a
# run whose requests are failing or served one at a time behind stalls.
MIN_OUTPUT_TOKENS_PER_S = 50.0


def bench_serve(
    base_url: str, backend: str, endpoint: str, tokenizer: Path, result_dir: Path
) -> dict[str, Any]:
    """Run `vllm bench serve` once; return its saved JSON result (and fail with its output if it fails)."""
    result_name = f"{backend}.json"
    argv = [str(VLLM), "bench", "serve", "--backend", backend, "--base-url", base_url, "--endpoint", endpoint]
    argv += ["--model", MODEL, "--tokenizer", str(tokenizer), "--dataset-name", "random"]
    argv += ["--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN)]
    argv += ["--num-prompts", str(PROMPTS), "--max-concurrency", str(CONCURRENCY), "--temperature", "0"]
    # One try of its first request: a failure is not hidden by a retry once the model is warm.
    argv += ["--ready-check-timeout-sec", "1", "--disable-tqdm"]
    argv += [
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        result_name,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "Initial test run completed." in output, output[-4000:]
    result: dict[str, Any] = json.loads((result_dir / result_name).read_text())
    return result


def assert_every_request_answered(result: dict[str, Any]) -> None:
    errors = [error for error in result["errors"] if error]
    assert result["failed"] == 0, errors[:3]
    assert result["completed"] == PROMPTS
    assert all(1 <= tokens <= OUTPUT_LEN for tokens in result["output_lens"]), result["output_lens"]
    assert all(text for text in result["generated_texts"])
    assert result["output_throughput"] > MIN_OUTPUT_TOKENS_PER_S, result["output_throughput"]


def admin(stack: Stack) -> dict[str, Any]:
    status: dict[str, Any] = httpx.get(f"{stack.base_url}/admin/models/{MODEL}", timeout=10).json()
    return status


def test_chat_completions_all_answered(stack: Stack, demo_model_dir: Path, tmp_path: Path) -> None:
    result = bench_serve(stack.base_url, "openai-chat", "/v1/chat/completions", demo_model_dir, tmp_path)
    assert_every_request_answered(result)


def test_completions_all_answered_the_first_on_a_just_unloaded_model(
    stack: Stack, demo_model_dir: Path, tmp_path: Path
) -> None:
    loads_before = admin(stack)["load_seconds"]["cpu"]["samples"]
    httpx.post(f"{stack.base_url}/admin/models/{MODEL}/unload", json={}, timeout=10).raise_for_status()
    stack.wait_until(lambda: admin(stack)["state"] == "cold", timeout_s=120, what="the unload")

    result = bench_serve(stack.base_url, "openai", "/v1/completions", demo_model_dir, tmp_path)

    assert_every_request_answered(result)
    loads = admin(stack)["load_seconds"]["cpu"]
    assert loads["samples"] == loads_before + 1, "its first request loaded the model"
    assert loads["last"] > 2 * FIRST_BYTE_BUDGET_S, "and waited past the first-byte budget, for keep-alives"
