"""A worker holding a TensorRT-LLM model, stopped by a signal: SIGKILL (nothing gets to stop anything)
and SIGTERM (what `docker compose stop` and Kubernetes send). TensorRT-LLM runs its engine in an
MPI worker process of its own, a descendant of the worker: both ways, nothing of it may stay on
the GPU. Written to be run with `make gpu-check`; see tests/gpu/conftest.py for when it is skipped.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import threading
from pathlib import Path

import openai
import psutil
import pytest

from tests.support.gpu import MESSAGES, Gpu, StartStack, trtllm_model
from tests.support.stack import Stack

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1800)]

# A worker's whole tree gone: what stays on the GPU is allocator and driver noise.
NOISE_MIB = 256.0
DRAIN_TIMEOUT_S = 120
STREAMS = 8
# Long answers: the streams are mid-way when the signal comes.
STREAM_TOKENS = 900


def _descendants(pid: int) -> list[psutil.Process]:
    """The worker's processes (Triton, TensorRT-LLM's MPI worker, ...), its guard left out."""
    found = []
    for process in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "descendants_guard" not in " ".join(process.cmdline()):
                found.append(process)
    return found


def test_a_worker_killed_with_sigkill_leaves_no_engine_process_and_frees_the_gpu(
    start_stack: StartStack, gpu: Gpu, model_dir: Path
) -> None:
    config = {"models": [trtllm_model(model_dir, "trt", keep_alive_s=-1)]}
    with start_stack(config) as running:
        stack = running.stack
        baseline = gpu.settled_mib()
        stack.wait_serving("trt")  # loaded on demand, through the controller
        loaded = gpu.settled_mib()
        worker = stack.workers[0]
        started = _descendants(worker.pid)
        print(f"\nGPU MiB: baseline {baseline:.0f}, loaded {loaded:.0f}; worker's processes:")
        print("\n".join(f"  {p.pid} {' '.join(p.cmdline())[:120]}" for p in started))
        assert len(started) >= 2, "Triton and TensorRT-LLM's own process"
        worker.killed = True  # the test ends it: the stack does not count its exit as a failure
        os.kill(worker.pid, signal.SIGKILL)  # the worker alone
        worker.process.wait(timeout=30)
        _, alive = psutil.wait_procs(started, timeout=30)
        assert not alive, [(p.pid, p.name()) for p in alive]
        gpu.wait_at_most(baseline + NOISE_MIB, timeout_s=60, what="the GPU after the worker was killed")


def test_sigterm_drains_the_running_streams_then_the_worker_exits_and_frees_the_gpu(
    start_stack: StartStack, gpu: Gpu, model_dir: Path
) -> None:
    config = {
        "worker": {"drain_timeout_s": DRAIN_TIMEOUT_S},
        "models": [trtllm_model(model_dir, "trt", keep_alive_s=-1)],
    }
    with start_stack(config) as running:
        stack = running.stack
        baseline = gpu.settled_mib()
        stack.wait_serving("trt")  # TensorRT-LLM's MPI worker runs from here on
        worker = stack.workers[0]
        first_tokens = threading.Semaphore(0)
        with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
            streams = [pool.submit(_stream, stack, first_tokens) for _ in range(STREAMS)]
            for _ in range(STREAMS):
                assert first_tokens.acquire(timeout=300), "every stream started"
            worker.killed = True  # the test stops it
            os.kill(worker.pid, signal.SIGTERM)  # as tini passes it on: to the worker alone
            answers = [stream.result(timeout=DRAIN_TIMEOUT_S + 60) for stream in streams]
        assert answers == [("length", STREAM_TOKENS)] * STREAMS, "every running stream finished whole"
        assert worker.process.wait(timeout=DRAIN_TIMEOUT_S + 60) == 0
        gpu.wait_at_most(baseline + NOISE_MIB, timeout_s=60, what="the GPU after the worker stopped")


def _stream(stack: Stack, first_token: threading.Semaphore) -> tuple[str | None, int]:
    """One long stream; `first_token` is released when its first text arrives."""
    finish, tokens, started = None, 0, False
    with openai.OpenAI(
        base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=600
    ) as client:
        stream = client.chat.completions.create(
            model="trt",
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=STREAM_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"min_tokens": STREAM_TOKENS},
        )
        for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
            for choice in chunk.choices:
                if choice.delta.content and not started:
                    started = True
                    first_token.release()
                finish = choice.finish_reason or finish
    return finish, tokens
