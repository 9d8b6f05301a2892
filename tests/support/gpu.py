"""The GPU check's harness (tests/gpu): whether it can run here, the GPU's memory, the models it serves.

Everything is asked from outside the product, as an operator would: the configuration file, the
HTTP API (`/v1` through the `openai` client, `/admin/models`), the worker's `/metrics`, process
signals, and the GPU's memory as the driver counts it (NVML: pynvml where it is installed, as in
TensorRT-LLM's container, else `nvidia-smi`). Nothing here imports an engine module or knows how
an engine is built, so the check holds whatever the engines' insides become.

What a person may set (the README's "TensorRT-LLM workers" section):

- `SWITCHBOARD_GPU_MODEL`: a Hugging Face model folder to serve instead of the demo model the
  tests build themselves (the demo's tiny shapes may not suit every TensorRT-LLM kernel);
- `SWITCHBOARD_GPU_ENGINE_ARGS`: JSON merged into the TensorRT-LLM models' `engine_args`;
- `SWITCHBOARD_GPU_VLLM_PYTHON`: a Python that has vLLM and Switchboard, to run a vLLM worker
  beside the TensorRT-LLM one on the same GPU (the check's image has one);
- `SWITCHBOARD_GPU_INDEX`: which GPU (NVML's index; 0 by default).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from switchboard.local.demo_model import is_complete
from switchboard.local.processes import spawn_group, stop_groups
from switchboard.logs import LOG_LABEL_ENV
from switchboard.ports import free_port
from tests.support.stack import STOP_TIMEOUT_S, Stack, running_stack

GPU_MODEL_ENV = "SWITCHBOARD_GPU_MODEL"
ENGINE_ARGS_ENV = "SWITCHBOARD_GPU_ENGINE_ARGS"
VLLM_PYTHON_ENV = "SWITCHBOARD_GPU_VLLM_PYTHON"
GPU_INDEX_ENV = "SWITCHBOARD_GPU_INDEX"

NEEDS = "needs a GPU and TensorRT-LLM"
NOT_ASKED_FOR = (
    f"the GPU check ({NEEDS}) runs only when asked for: `make gpu-check`, or `pytest -m gpu` "
    "inside the TensorRT-LLM image"
)
MIB = 1024**2
MESSAGES = [{"role": "user", "content": "Tell me a long story about the sea."}]


def asked_for(markexpr: str) -> bool:
    """Whether `-m` selects the GPU check (`-m gpu`, `-m "gpu and not slow"`, not `-m "not gpu"`)."""
    return bool(re.search(r"\bgpu\b", markexpr)) and not re.search(r"\bnot\s+gpu\b", markexpr)


def unavailable_reason() -> str | None:
    """Why the GPU check cannot run here, or None. Imports nothing heavy and touches no GPU."""
    missing = []
    if importlib.util.find_spec("tensorrt_llm") is None:
        missing.append(
            "TensorRT-LLM is not installed (run `make gpu-check`: it runs in the TensorRT-LLM image)"
        )
    if not _gpu_names():
        missing.append("no NVIDIA GPU is visible (nvidia-smi lists none)")
    return f"{NEEDS}: {'; '.join(missing)}" if missing else None


def _gpu_names() -> list[str]:
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return []
    try:
        listing = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line for line in listing.stdout.splitlines() if line.startswith("GPU ")]


class Gpu:
    """One GPU's memory as its driver counts it: every process on it, contexts included."""

    def __init__(self, index: int) -> None:
        self.index = index

    def used_mib(self) -> float:
        """Memory in use on the GPU now (MiB)."""
        try:
            import pynvml
        except ImportError:
            return self._used_mib_from_nvidia_smi()
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            return float(pynvml.nvmlDeviceGetMemoryInfo(handle).used) / MIB
        finally:
            pynvml.nvmlShutdown()

    def _used_mib_from_nvidia_smi(self) -> float:
        output = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", f"--id={self.index}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        return float(output.strip().splitlines()[0])

    def settled_mib(
        self, *, within_mib: float = 32.0, every_s: float = 2.0, timeout_s: float = 120.0
    ) -> float:
        """The memory in use once two readings `every_s` apart differ by less than `within_mib`."""
        deadline = time.monotonic() + timeout_s
        last = self.used_mib()
        while True:
            time.sleep(every_s)
            now = self.used_mib()
            if abs(now - last) < within_mib or time.monotonic() > deadline:
                return now
            last = now

    def wait_at_most(self, limit_mib: float, *, timeout_s: float, what: str) -> float:
        """Wait until the memory in use is at most `limit_mib`; returns it, or fails saying `what`."""
        deadline = time.monotonic() + timeout_s
        readings = []
        while True:
            used = self.used_mib()
            readings.append(round(used))
            if used <= limit_mib:
                return used
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{what}: {used:.0f} MiB in use after {timeout_s:g} s, limit {limit_mib:.0f} MiB; readings {readings[-10:]}"
                )
            time.sleep(1.0)

    def cuda_env(self) -> dict[str, str]:
        """What makes CUDA's device 0 in a process this GPU (NVML's numbering is the PCI bus order)."""
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(self.index)}


def gpu_from_env() -> Gpu:
    """The GPU the check runs on: `SWITCHBOARD_GPU_INDEX`, or the first."""
    return Gpu(int(os.environ.get(GPU_INDEX_ENV, "0")))


# --- stacks ---------------------------------------------------------------------------------------


@dataclass
class GpuStack:
    """A running stack on the GPU, and where its (first) worker serves its metrics."""

    stack: Stack
    metrics_port: int


StartStack = Callable[..., contextlib.AbstractContextManager[GpuStack]]


def stack_on(
    gpu: Gpu, config: Mapping[str, Any], *, root: Path, session: pytest.Session, **options: Any
) -> contextlib.AbstractContextManager[GpuStack]:
    """A stack (Redis, worker, front door) whose processes use this GPU; see tests/support/stack.py."""

    @contextlib.contextmanager
    def started() -> Iterator[GpuStack]:
        port = free_port()
        env = {
            **gpu.cuda_env(),
            "SWITCHBOARD_WORKER__METRICS_PORT": str(port),
            # Heartbeats often: /admin/models follows in-flight counts closely.
            "SWITCHBOARD_WORKER__HEARTBEAT_S": "0.5",
            **options.pop("env", {}),
        }
        with running_stack(config, root=root, session=session, env=env, **options) as stack:
            yield GpuStack(stack, port)

    return started()


# --- models -----------------------------------------------------------------------------------------


def _demo_dtype(model_dir: Path) -> dict[str, Any]:
    # The demo model is saved in float32; the GPU engines' attention kernels want 16-bit weights.
    return {"dtype": "bfloat16"} if is_complete(model_dir) else {}


def trtllm_model(model_dir: Path, name: str, **fields: Any) -> dict[str, Any]:
    """A `[[models]]` entry served by TensorRT-LLM, with the arguments that make its footprint small
    and predictable; `SWITCHBOARD_GPU_ENGINE_ARGS` (JSON) and `engine_args` in `fields` override them."""
    engine_args: dict[str, Any] = {
        "max_seq_len": 1024,
        "max_batch_size": 16,
        "max_num_tokens": 2048,
        "enable_chunked_prefill": True,
        "kv_cache_config": {"max_tokens": 16384, "free_gpu_memory_fraction": 0.2},
        # A short capture list: a quicker start, and every batch size the check uses.
        "cuda_graph_config": {"batch_sizes": [1, 2, 4, 8, 16]},
        **_demo_dtype(model_dir),
        **json.loads(os.environ.get(ENGINE_ARGS_ENV) or "{}"),
        **fields.pop("engine_args", {}),
    }
    return {"name": name, "path": str(model_dir), "engine": "trtllm", "engine_args": engine_args, **fields}


def vllm_model(model_dir: Path, name: str, **fields: Any) -> dict[str, Any]:
    """A `[[models]]` entry served by vLLM on the GPU, taking a quarter of it."""
    engine_args: dict[str, Any] = {
        "max_model_len": 1024,
        "gpu_memory_utilization": 0.25,
        **_demo_dtype(model_dir),
        **fields.pop("engine_args", {}),
    }
    return {"name": name, "path": str(model_dir), "engine": "vllm", "engine_args": engine_args, **fields}


# --- the product from outside -------------------------------------------------------------------------


def admin(stack: Stack, model: str) -> dict[str, Any]:
    """`GET /admin/models/{model}`: where the model stands on every worker."""
    with urllib.request.urlopen(f"{stack.base_url}/admin/models/{model}", timeout=10) as response:
        status: dict[str, Any] = json.loads(response.read())
        return status


def ask(stack: Stack, model: str, action: str) -> None:
    """`POST /admin/models/{model}/load` or `/unload`: the controllers act on it."""
    request = urllib.request.Request(
        f"{stack.base_url}/admin/models/{model}/{action}",
        data=b"{}",
        headers={"Content-Type": "application/json"},  # admin POSTs are JSON only
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 202


def wait_state(stack: Stack, model: str, state: str, *, timeout_s: float = 900.0) -> dict[str, Any]:
    """Wait until `/admin/models` shows the model in `state`; returns its status."""
    return stack.wait_until(
        lambda: (status := admin(stack, model))["state"] == state and status,
        timeout_s=timeout_s,
        what=f"{model} to be {state}",
    )


def wait_idle(stack: Stack, model: str, *, timeout_s: float = 60.0) -> None:
    """Wait until no job of the model runs or waits: nothing was left hanging."""
    stack.wait_until(
        lambda: (status := admin(stack, model))["in_flight"] == 0 and status["waiting"] == 0,
        timeout_s=timeout_s,
        what=f"every job of {model} to end",
    )


def load_samples(stack: Stack, model: str) -> int:
    """How many loads of the model were measured (on this GPU's kind of worker)."""
    return sum(int(kind["samples"]) for kind in admin(stack, model)["load_seconds"].values())


Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Metrics:
    """A worker's `/metrics` (its own, then its Triton's), sample by sample."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(metrics: Metrics, name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels`."""
    return sum(
        value
        for (sample, sample_labels), value in metrics.items()
        if sample == name and set(labels.items()) <= set(sample_labels)
    )


@dataclass
class Streamed:
    """One streamed chat completion as the client saw it."""

    text: str
    chunks: int
    finish_reason: str | None
    completion_tokens: int
    first_token_s: float
    total_s: float

    @property
    def inter_token_s(self) -> float:
        """Seconds per output token after the first (tokens arrive coalesced, so per token on average)."""
        return (self.total_s - self.first_token_s) / max(1, self.completion_tokens - 1)


def stream_chat(client: openai.OpenAI, model: str, max_tokens: int, **options: Any) -> Streamed:
    """Stream one chat completion to its end; `min_tokens` = `max_tokens`, so it ends by length."""
    started = time.monotonic()
    first_token_s = 0.0
    text, chunks, finish_reason, usage = [], 0, None, 0
    stream = client.chat.completions.create(
        model=model,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"min_tokens": max_tokens},
        **options,
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        for choice in chunk.choices:
            if choice.delta.content:
                if not text:
                    first_token_s = time.monotonic() - started
                text.append(choice.delta.content)
                chunks += 1
            finish_reason = choice.finish_reason or finish_reason
    return Streamed("".join(text), chunks, finish_reason, usage, first_token_s, time.monotonic() - started)


@contextlib.contextmanager
def worker_beside(
    stack: Stack, python: str, env: Mapping[str, str], *, name: str = "worker-vllm"
) -> Iterator[subprocess.Popen[bytes]]:
    """One more worker on the stack's Redis and configuration, run by another Python (another
    environment: vLLM's, beside TensorRT-LLM's); stopped with SIGTERM when the block ends."""
    log_path = stack.log_dir / f"{name}.log"
    argv = [python, "-m", "switchboard", "--log-level", "INFO", "--config", str(stack.config_path)]
    argv += ["worker", "--log-file", str(log_path)]
    child_env = {**os.environ, **env, "REDIS_URL": stack.redis_url, LOG_LABEL_ENV: name}
    # The TensorRT-LLM container's library path (its CUDA, NCCL, MPI) must not shadow the libraries
    # that the other environment's own torch wheel brings.
    child_env.pop("LD_LIBRARY_PATH", None)
    with stack.console_log.open("ab") as console:
        process = spawn_group(argv, child_env, stdout=console)
    try:
        yield process
    finally:
        forced = stop_groups([process], STOP_TIMEOUT_S)
        assert not forced, f"{name} did not stop on SIGTERM within {STOP_TIMEOUT_S:.0f} s; log {log_path}"
