"""A TensorRT-LLM model served through every real part on a GPU: openai client → front door → Redis →
worker (PyTriton) → TensorRT-LLM's `LLM`, loaded by the model controller, and clients that leave.

One stack for this module: a worker holding one `engine = "trtllm"` model, loaded once through the
controller (`POST /admin/models/{name}/load`) by the first test. Each test reports what it saw
on stdout (`pytest -s` shows it). Written to be run with `make gpu-check`; see tests/gpu/conftest.py
for when it is skipped.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.support.gpu import (
    MESSAGES,
    Gpu,
    GpuStack,
    admin,
    ask,
    load_samples,
    scrape,
    stack_on,
    stream_chat,
    total,
    trtllm_model,
    wait_idle,
    wait_state,
)

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1800)]

MODEL = "trt"
# The engine batches 16 at a time (trtllm_model), so 64 streams keep 48 waiting inside it; long
# answers keep the first ones running while clients leave.
STREAMS = 64
STREAM_TOKENS = 768


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, gpu: Gpu, model_dir: Path
) -> Iterator[GpuStack]:
    """A stack whose worker may hold the TensorRT-LLM model; a client that leaves cancels at once."""
    config = {
        "router": {"resume_grace_s": 0},
        "models": [trtllm_model(model_dir, MODEL, keep_alive_s=-1)],
    }
    with stack_on(
        gpu, config, root=tmp_path_factory.mktemp("gpu-serving"), session=request.session
    ) as running:
        yield running


def client(running: GpuStack) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{running.stack.base_url}/v1", api_key="unused", max_retries=0, timeout=600
    )


def test_a_model_loaded_through_the_controller_streams_through_the_whole_path(served: GpuStack) -> None:
    stack = served.stack
    assert admin(stack, MODEL)["state"] == "cold", "nothing is loaded before it is asked for"
    ask(stack, MODEL, "load")
    status = wait_state(stack, MODEL, "warm")
    assert [replica["state"] for replica in status["replicas"]] == ["warm"]
    assert load_samples(stack, MODEL) == 1, "the load was timed and recorded"
    metrics = scrape(served.metrics_port)
    assert total(metrics, "switchboard:model_loads_total", model=MODEL, outcome="ok") == 1
    assert total(metrics, "switchboard:model_memory_bytes", model=MODEL) > 0

    with client(served) as openai_client:
        streamed = stream_chat(openai_client, MODEL, max_tokens=64)
        reply = openai_client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=16,
            temperature=0,
        )
    print(
        f"\n{MODEL}: first token {streamed.first_token_s * 1000:.0f} ms, "
        f"{streamed.inter_token_s * 1000:.1f} ms per token after it, {streamed.chunks} chunks"
    )
    assert streamed.text and streamed.chunks >= 1
    assert (streamed.finish_reason, streamed.completion_tokens) == ("length", 64)
    assert reply.choices[0].message.content and reply.usage is not None
    assert reply.usage.completion_tokens <= 16


def test_streams_left_with_logprobs_on_are_aborted_and_the_engine_serves_on(served: GpuStack) -> None:
    # TensorRT-LLM issue #10810: a crash on abort while streaming with logprobs.
    stack = served.stack
    stack.wait_serving(MODEL)
    before = scrape(served.metrics_port)
    with client(served) as openai_client:
        for _ in range(8):
            stream = openai_client.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,  # type: ignore[arg-type]
                max_tokens=400,
                logprobs=True,
                top_logprobs=5,
                stream=True,
                extra_body={"min_tokens": 400},
            )
            with_logprobs = 0
            for chunk in stream:
                choice = chunk.choices[0] if chunk.choices else None
                if choice is not None and choice.logprobs is not None and choice.logprobs.content:
                    assert len(choice.logprobs.content[0].top_logprobs) == 5
                    with_logprobs += 1
                if with_logprobs >= 3:
                    break
            stream.close()  # the client leaves mid-stream
            assert with_logprobs >= 3
        left_at = time.monotonic()
        wait_idle(stack, MODEL, timeout_s=30)
        print(f"\n8 streams with logprobs left: engine idle {time.monotonic() - left_at:.1f} s after")
        after = scrape(served.metrics_port)
        aborted = total(after, "switchboard:worker_jobs_total", model=MODEL, outcome="aborted") - total(
            before, "switchboard:worker_jobs_total", model=MODEL, outcome="aborted"
        )
        assert aborted == 8
        # Still serving, logprobs included, to the end.
        reply = openai_client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=32,
            logprobs=True,
            top_logprobs=2,
            extra_body={"min_tokens": 32},
        )
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].logprobs is not None and len(reply.choices[0].logprobs.content or []) == 32
    assert admin(stack, MODEL)["state"] == "warm"


def test_64_streams_with_random_disconnects_leave_no_job_hanging(served: GpuStack) -> None:
    stack = served.stack
    stack.wait_serving(MODEL)
    rng = random.Random(64)
    # Half leave at a random moment (running in the engine's batch, or still waiting in its queue);
    # the other half read to the end. A third ask for logprobs.
    plans = [(rng.random() < 0.5, rng.uniform(0.05, 3.0), index % 3 == 0) for index in range(STREAMS)]
    before = scrape(served.metrics_port)

    async def one(async_client: openai.AsyncOpenAI, leaves: bool, after_s: float, logprobs: bool) -> str:
        async def read() -> str:
            stream = await async_client.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,  # type: ignore[arg-type]
                max_tokens=STREAM_TOKENS,
                stream=True,
                logprobs=logprobs,
                extra_body={"min_tokens": STREAM_TOKENS},
            )
            finish = None
            async for chunk in stream:
                for choice in chunk.choices:
                    finish = choice.finish_reason or finish
            return f"finished:{finish}"

        if not leaves:
            return await read()
        try:
            return await asyncio.wait_for(read(), timeout=after_s)
        except TimeoutError:
            return "left"

    async def all_streams() -> list[str]:
        async with openai.AsyncOpenAI(
            base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=600
        ) as async_client:
            return await asyncio.gather(*(one(async_client, *plan) for plan in plans))

    started = time.monotonic()
    outcomes = Counter(asyncio.run(all_streams()))
    seconds = time.monotonic() - started
    wait_idle(stack, MODEL, timeout_s=60)
    after = scrape(served.metrics_port)
    print(f"\n{STREAMS} streams in {seconds:.1f} s: {dict(outcomes)}")

    stayed = sum(1 for leaves, _, _ in plans if not leaves)
    assert outcomes["finished:length"] >= stayed, "every stream that stayed was answered to its end"
    assert set(outcomes) <= {"finished:length", "left"}
    jobs = {
        outcome: total(after, "switchboard:worker_jobs_total", model=MODEL, outcome=outcome)
        - total(before, "switchboard:worker_jobs_total", model=MODEL, outcome=outcome)
        for outcome in ("finished", "aborted", "skipped", "failed")
    }
    assert jobs["failed"] == 0, jobs
    # Each job ended once: answered, aborted in the engine (running or queued there), or never
    # started because its client had left first.
    assert jobs["finished"] + jobs["aborted"] + jobs["skipped"] == STREAMS, jobs
    # And it still serves.
    with client(served) as openai_client:
        assert stream_chat(openai_client, MODEL, max_tokens=8).finish_reason == "length"
