"""GPU memory as the driver counts it, around TensorRT-LLM models loaded and unloaded by the controller:
back to its baseline after every unload, no growth over cycles, two TensorRT-LLM models side by
side, and TensorRT-LLM beside vLLM on one GPU.

Each test starts its own stack and measures the GPU before it loads anything. The worker process
keeps one CUDA context of its own once TensorRT-LLM's front end has run in it (TensorRT-LLM makes
one there at the first load, and a context is freed only when its process ends): after an unload
the GPU may hold that much more than at the start, and no more, and never grows after that.
Written to be run with `make gpu-check`; see tests/gpu/conftest.py for when it is skipped.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import statistics
import subprocess
from pathlib import Path

import openai
import pytest

from switchboard.ports import free_port
from tests.support.gpu import (
    VLLM_PYTHON_ENV,
    Gpu,
    GpuStack,
    StartStack,
    Streamed,
    admin,
    ask,
    load_samples,
    scrape,
    stream_chat,
    total,
    trtllm_model,
    vllm_model,
    wait_state,
    worker_beside,
)
from tests.support.stack import Stack

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(2400)]

# One CUDA context (a few hundred MiB on current GPUs), with room to spare.
CONTEXT_ALLOWANCE_MIB = 1024.0
# What may differ between two unloaded states: allocator and driver noise, never a model's share.
GROWTH_ALLOWANCE_MIB = 256.0
CYCLES = 3


def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=600)


def side_by_side(
    stack: Stack, models: list[str], *, rounds: int = 8, max_tokens: int = 64
) -> dict[str, list[Streamed]]:
    """`rounds` streams per model, one of each model at a time; what each client saw."""
    futures: dict[str, list[concurrent.futures.Future[Streamed]]] = {model: [] for model in models}
    with client(stack) as openai_client, concurrent.futures.ThreadPoolExecutor(len(models)) as pool:
        for _ in range(rounds):
            for model in models:
                futures[model].append(pool.submit(stream_chat, openai_client, model, max_tokens))
        return {model: [future.result(timeout=600) for future in done] for model, done in futures.items()}


def report(streams: dict[str, list[Streamed]]) -> None:
    """Time to first token and per-token time of each model, medians over its streams."""
    for model, seen in streams.items():
        first = statistics.median(s.first_token_s for s in seen) * 1000
        per_token = statistics.median(s.inter_token_s for s in seen) * 1000
        print(
            f"  {model}: first token {first:.0f} ms, {per_token:.2f} ms per token after it (median of {len(seen)})"
        )


def test_three_load_unload_cycles_return_gpu_memory_to_its_baseline(
    start_stack: StartStack, gpu: Gpu, model_dir: Path
) -> None:
    config = {"worker": {"max_loaded_models": 1}, "models": [trtllm_model(model_dir, "trt", keep_alive_s=-1)]}
    with start_stack(config) as running:
        stack = running.stack
        baseline = gpu.settled_mib()
        warm, unloaded = [], []
        with client(stack) as openai_client:
            for cycle in range(1, CYCLES + 1):
                ask(stack, "trt", "load")
                wait_state(stack, "trt", "warm")
                assert stream_chat(openai_client, "trt", max_tokens=32).finish_reason == "length"
                warm.append(gpu.used_mib())
                ask(stack, "trt", "unload")
                wait_state(stack, "trt", "cold")
                unloaded.append(
                    gpu.wait_at_most(
                        baseline + CONTEXT_ALLOWANCE_MIB,
                        timeout_s=60,
                        what=f"cycle {cycle}: the GPU's memory back after the unload",
                    )
                )
        print(
            f"\nGPU MiB: baseline {baseline:.0f}, warm {[round(w) for w in warm]}, unloaded {[round(u) for u in unloaded]}"
        )
        assert min(warm) > max(unloaded) + 64, "a loaded model holds GPU memory, an unloaded one none"
        assert max(unloaded) - unloaded[0] <= GROWTH_ALLOWANCE_MIB, "no growth from one cycle to the next"
        metrics = scrape(running.metrics_port)
        assert total(metrics, "switchboard:model_loads_total", model="trt", outcome="ok") == CYCLES
        assert total(metrics, "switchboard:model_unloads_total", model="trt") == CYCLES
        assert total(metrics, "switchboard:model_memory_bytes", model="trt") == 0
        assert load_samples(stack, "trt") == CYCLES


def test_two_trtllm_models_take_their_fraction_of_what_is_free_and_serve_side_by_side(
    start_stack: StartStack, gpu: Gpu, model_dir: Path
) -> None:
    # No cap on the KV cache: each model's cache is its fraction of the memory free when it loads.
    fraction = {"kv_cache_config": {"free_gpu_memory_fraction": 0.3}}
    config = {
        "worker": {"max_loaded_models": 2},
        "models": [
            trtllm_model(model_dir, name, keep_alive_s=-1, engine_args=fraction)
            for name in ("trt-a", "trt-b")
        ],
    }
    with start_stack(config) as running:
        stack = running.stack
        baseline = gpu.settled_mib()
        used = [baseline]
        for model in ("trt-a", "trt-b"):
            ask(stack, model, "load")
            wait_state(stack, model, "warm")
            used.append(gpu.settled_mib())
        took_a, took_b = used[1] - used[0], used[2] - used[1]
        streams = side_by_side(stack, ["trt-a", "trt-b"])
        print(f"\nGPU MiB: baseline {baseline:.0f}, trt-a took {took_a:.0f}, then trt-b {took_b:.0f}")
        report(streams)
        assert all(s.finish_reason == "length" for seen in streams.values() for s in seen)
        assert took_b < took_a, "the second model's share is of what the first left free"
        for model in ("trt-a", "trt-b"):
            ask(stack, model, "unload")
            wait_state(stack, model, "cold")
        gpu.wait_at_most(baseline + CONTEXT_ALLOWANCE_MIB, timeout_s=60, what="both unloaded")


def test_one_worker_holds_a_trtllm_and_a_vllm_model_side_by_side(
    start_stack: StartStack, gpu: Gpu, model_dir: Path
) -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip(
            "vLLM is not installed beside TensorRT-LLM here: one worker is one Python environment, and "
            "TensorRT-LLM 1.2.1's container (NVIDIA's torch 2.10.0a0, transformers 4.57) and the vLLM "
            "Switchboard runs pin different torch and transformers; the next test runs both engines on "
            "this GPU in two workers"
        )
    config = {
        "worker": {"max_loaded_models": 2},
        "models": [
            trtllm_model(model_dir, "trt", keep_alive_s=-1),
            vllm_model(model_dir, "vllm", keep_alive_s=-1),
        ],
    }
    with start_stack(config) as running:
        _both_engines_on_one_gpu(running, gpu, contexts=1)


def test_a_trtllm_worker_and_a_vllm_worker_share_one_gpu(
    start_stack: StartStack, gpu: Gpu, model_dir: Path
) -> None:
    python = os.environ.get(VLLM_PYTHON_ENV)
    if not python or not Path(python).is_file():
        pytest.skip(
            f"no Python with vLLM for a second worker: set {VLLM_PYTHON_ENV} (the GPU check's image, "
            "deploy/gpu-check/Dockerfile, has one)"
        )
    config = {
        "worker": {"max_loaded_models": 1},
        "models": [
            trtllm_model(model_dir, "trt", keep_alive_s=-1),
            vllm_model(model_dir, "vllm", keep_alive_s=-1),
        ],
    }
    with start_stack(config, worker_env=[{"SWITCHBOARD_WORKER__MODELS": '["trt"]'}]) as running:
        vllm_env = {
            **gpu.cuda_env(),
            "SWITCHBOARD_WORKER__MODELS": '["vllm"]',
            "SWITCHBOARD_WORKER__METRICS_PORT": str(free_port()),
            "SWITCHBOARD_WORKER__HEARTBEAT_S": "0.5",
            "SWITCHBOARD_WORKER__DRAIN_TIMEOUT_S": "5",
        }
        with worker_beside(running.stack, python, vllm_env) as vllm_worker:
            _both_engines_on_one_gpu(running, gpu, contexts=2, beside=vllm_worker)


def _both_engines_on_one_gpu(
    running: GpuStack, gpu: Gpu, *, contexts: int, beside: subprocess.Popen[bytes] | None = None
) -> None:
    """Load the TensorRT-LLM model, then the vLLM one; both answer at once; both unload and leave
    the GPU as it was but for `contexts` CUDA contexts of the worker processes."""
    stack = running.stack
    baseline = gpu.settled_mib()
    for model in ("trt", "vllm"):
        ask(stack, model, "load")
        stack.wait_until(
            lambda model=model: _alive(beside) and _state(stack, model) == "warm",
            timeout_s=900,
            what=f"{model} to be warm",
            poll_s=0.5,
        )
    loaded = gpu.settled_mib()
    streams = side_by_side(stack, ["trt", "vllm"])
    print(f"\nGPU MiB: baseline {baseline:.0f}, both loaded {loaded:.0f}; the same model on each engine:")
    report(streams)
    assert all(
        s.finish_reason == "length" and s.completion_tokens == 64 for seen in streams.values() for s in seen
    )
    for model in ("trt", "vllm"):
        ask(stack, model, "unload")
        wait_state(stack, model, "cold")
    gpu.wait_at_most(baseline + contexts * CONTEXT_ALLOWANCE_MIB, timeout_s=60, what="both engines unloaded")


def _alive(process: subprocess.Popen[bytes] | None) -> bool:
    code = None if process is None else process.poll()
    assert code is None, f"the worker beside exited with code {code}; its log is in the stack's folder"
    return True


def _state(stack: Stack, model: str) -> str:
    return str(admin(stack, model)["state"])
