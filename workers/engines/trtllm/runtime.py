"""TensorRT-LLM itself: imported once per worker, an `LLM` built and shut down with every process it starts.

The worker imports TensorRT-LLM in the background right after it starts (`registry.import_runtimes`),
so a cold load does not pay the import. A build runs in a thread; the processes TensorRT-LLM starts
for it (its MPI executor) are found as the worker's children that appear meanwhile, one build at a
time, and every one of them is waited for or killed when the engine stops or its build fails.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
import threading
import time
from typing import Any

import psutil

from switchboard.config import ModelConfig
from workers.engines.process_env import process_tree, reap
from workers.engines.prompts import PromptBuilder
from workers.engines.trtllm.load_plan import LoadPlan

logger = logging.getLogger(__name__)

RUNTIME_MODULE = "tensorrt_llm.llmapi"
# Where TensorRT-LLM keeps its LoRA settings (`LoraConfig`) and a request's adapter (`LoRARequest`).
LORA_MODULE = "tensorrt_llm.lora_manager"
LORA_REQUEST_MODULE = "tensorrt_llm.executor.request"
# How long a stop (or a failed build) waits for the engine's processes to exit before killing them.
REAP_TIMEOUT_S = 10.0

_runtime_lock = threading.Lock()
_runtime_imported = False
# One build at a time per worker: the processes that appear during a build are that engine's.
_build_lock = threading.Lock()


def import_runtime() -> Any:
    """Import TensorRT-LLM's LLM API (seconds; once per process, from any thread); the module.

    RuntimeError, saying so, where TensorRT-LLM is not installed.
    """
    global _runtime_imported
    with _runtime_lock:
        started = time.monotonic()
        try:
            runtime = importlib.import_module(RUNTIME_MODULE)
        except ImportError as exc:
            raise RuntimeError(
                'TensorRT-LLM is not installed in this worker\'s environment (engine = "trtllm" '
                f"needs the worker-trtllm image): {exc}"
            ) from exc
        if not _runtime_imported:
            from transformers import AutoTokenizer  # noqa: F401

            _runtime_imported = True
            logger.info("engine runtime imported", extra={"seconds": round(time.monotonic() - started, 2)})
        return runtime


def imported_llm_class() -> Any:
    """TensorRT-LLM's `LLM` class if the runtime is imported already (this never imports it), else None."""
    return getattr(sys.modules.get(RUNTIME_MODULE), "LLM", None)


def can_release(llm: Any) -> bool:
    """Whether an `LLM` (or its class) can release and resume its GPU memory (newer than 1.2)."""
    return llm is not None and hasattr(llm, "release") and hasattr(llm, "resume")


class Built:
    """What a build made: the engine, its tokenizer and prompt builder, the processes it started."""

    def __init__(
        self, llm: Any, tokenizer: Any, prompts: PromptBuilder, pids: list[int], phases: dict[str, float]
    ) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.prompts = prompts
        self.pids = pids
        # Seconds of each part: import, tokenizer, construct (weights, KV cache, warm-up).
        self.phases = phases


def build(model: ModelConfig, plan: LoadPlan) -> Built:
    """Blocking: import, the model's tokenizer, then the `LLM` (which loads the weights and starts
    its executor). A failed build leaves no process; its error names the model."""
    phases: dict[str, float] = {}
    mark = time.monotonic()
    runtime = import_runtime()
    phases["import"], mark = time.monotonic() - mark, time.monotonic()
    from transformers import AutoTokenizer

    trust_remote_code = bool(model.engine_args.get("trust_remote_code", False))
    tokenizer = AutoTokenizer.from_pretrained(model.path, trust_remote_code=trust_remote_code)
    phases["tokenizer"], mark = time.monotonic() - mark, time.monotonic()
    with _build_lock:
        before = _child_pids()
        try:
            kwargs = {
                **plan.kwargs,
                "kv_cache_config": runtime.KvCacheConfig(**plan.kwargs["kv_cache_config"]),
            }
            if "lora_config" in plan.kwargs:
                lora_manager = importlib.import_module(LORA_MODULE)
                kwargs["lora_config"] = lora_manager.LoraConfig(**plan.kwargs["lora_config"])
            llm = runtime.LLM(model=model.path, tokenizer=tokenizer, **kwargs)
        except BaseException as exc:
            killed = reap(process_tree(sorted(_child_pids() - before)), REAP_TIMEOUT_S)
            if killed:
                logger.warning("processes of a failed engine build killed", extra={"pids": killed})
            if isinstance(exc, Exception):
                raise RuntimeError(f"TensorRT-LLM could not load {model.name}: {exc}") from exc
            raise
        pids = sorted(_child_pids() - before)
    phases["construct"] = time.monotonic() - mark
    prompts = PromptBuilder(
        tokenizer, model_name=model.name, max_model_len=plan.max_seq_len, vocab_size=plan.vocab_size
    )
    return Built(llm, tokenizer, prompts, pids, {name: round(s, 3) for name, s in phases.items()})


def shut_down(llm: Any, pids: list[int]) -> None:
    """Blocking: TensorRT-LLM's shutdown, then every process of the engine waited for or killed."""
    processes = process_tree(pids)
    try:
        llm.shutdown()
    except Exception:
        logger.exception("the engine's shutdown failed; its processes are killed")
    survivors = reap(processes, REAP_TIMEOUT_S)
    if survivors:
        logger.warning("engine processes killed after shutdown", extra={"pids": survivors})


def embedding_bias(logit_bias: dict[int, float], vocab_size: int) -> Any:
    """OpenAI's logit_bias as TensorRT-LLM's `embedding_bias`: float32 over the whole vocabulary."""
    import torch

    bias = torch.zeros(vocab_size, dtype=torch.float32)
    for token, value in logit_bias.items():
        bias[token] = float(value)
    return bias


@functools.cache
def machine_budget_bytes() -> int:
    """The worker's default memory budget (asks nvidia-smi: once per process, at the boot estimate)."""
    from workers.runtime.machine import machine_kind, memory_budget_bytes

    return memory_budget_bytes(machine_kind(), None)


def _child_pids() -> set[int]:
    """This process's children now (the processes a build starts appear among them)."""
    return {child.pid for child in psutil.Process().children()}
