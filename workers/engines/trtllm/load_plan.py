"""What a TensorRT-LLM engine is built with, and the memory it will take, decided before it is built.

Pure: it reads the model's configuration and files, never `tensorrt_llm`, so a worker can estimate
a footprint at start and refuse what the engine cannot do before any GPU work begins.

The KV cache: TensorRT-LLM sizes it, by default, as `free_gpu_memory_fraction` (0.9) of the GPU
memory that is free once the weights are loaded. That depends on what else the GPU holds: the
first model takes 90 % of what was free, and a second one finds nothing left, although placement
counted room for it. So unless the model's `kv_cache_config` bounds the cache itself (`max_tokens`
or `max_gpu_total_bytes`), it is bounded here in bytes (`max_gpu_total_bytes`, of which TensorRT-LLM
takes the smaller with the fraction): DEFAULT_KV_CACHE_SHARE of the worker's memory budget, but no
more than `max_batch_size` sequences of `max_seq_len` tokens can use, and no less than one.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from switchboard.config import LoraConfig, ModelConfig
from workers.engines import model_files

GIB = 1024**3
# The KV cache of one model, as a share of the worker's memory budget, unless its configuration says.
DEFAULT_KV_CACHE_SHARE = 0.25
# What a loaded engine holds beyond its weights and KV cache: the executor process's CUDA context,
# activations at `max_num_tokens` per step, CUDA graphs. An estimate until the first load is measured.
RUNTIME_OVERHEAD_BYTES = 2 * GIB
# TensorRT-LLM's own defaults (llm_args.py, 1.2), where the configuration leaves them unset.
TRT_MAX_BATCH_SIZE = 2048
TRT_TOKENS_PER_BLOCK = 32
TRT_FREE_GPU_MEMORY_FRACTION = 0.9
# Arguments Switchboard sets itself: the model's path, and the one tokenizer it and the prompts share.
OWNED_ARGS = ("model", "tokenizer", "skip_tokenizer_init")


class UnsupportedModel(ValueError):
    """The model's configuration asks for something this engine cannot do; the load fails with this."""


class LoadPlan:
    """The `LLM(...)` arguments of one model (all but the tokenizer) and the memory they will take."""

    def __init__(
        self,
        *,
        kwargs: dict[str, Any],
        max_seq_len: int,
        max_batch_size: int,
        vocab_size: int,
        weights_bytes: int,
        kv_cache_bytes: int,
    ) -> None:
        self.kwargs = kwargs
        self.max_seq_len = max_seq_len
        self.max_batch_size = max_batch_size
        self.vocab_size = vocab_size
        self.weights_bytes = weights_bytes
        # The KV cache's ceiling: what TensorRT-LLM allocates at most (less where less is free).
        self.kv_cache_bytes = kv_cache_bytes

    @property
    def footprint_bytes(self) -> int:
        """Weights, KV cache and the runtime's overhead: what placement counts before a load is measured."""
        return self.weights_bytes + self.kv_cache_bytes + RUNTIME_OVERHEAD_BYTES

    @property
    def structured_output(self) -> bool:
        """Whether requests may constrain their output (a guided decoding backend is configured)."""
        return self.kwargs.get("guided_decoding_backend") is not None


def refusal(model: ModelConfig) -> str | None:
    """Why this engine cannot serve `model` as configured (None: it can). Checked before loading."""
    if model.tool_call_parser is not None:
        return (
            f"model {model.name!r}: the TensorRT-LLM engine does not parse tool calls "
            f"(tool_call_parser = {model.tool_call_parser!r}); remove tool_call_parser, or serve the "
            'model with engine = "vllm"'
        )
    backend = model.engine_args.get("backend", "pytorch")
    if backend != "pytorch":
        return (
            f"model {model.name!r}: engine_args.backend = {backend!r} is not supported; the TensorRT-LLM "
            'engine runs the PyTorch backend (no engine build): remove backend or set it to "pytorch"'
        )
    owned = sorted(set(OWNED_ARGS) & set(model.engine_args))
    if owned:
        return (
            f"model {model.name!r}: engine_args may not set {', '.join(owned)}: the engine loads the "
            "model from its path with the model's own tokenizer, which the prompts share"
        )
    kv_cache = model.engine_args.get("kv_cache_config", {})
    if not isinstance(kv_cache, dict):
        return f"model {model.name!r}: engine_args.kv_cache_config must be a table of KvCacheConfig fields"
    return None


def plan_load(model: ModelConfig, memory_budget_bytes: int) -> LoadPlan:
    """The arguments and memory of `model`'s engine; UnsupportedModel if it cannot be served.

    `memory_budget_bytes`: what the worker's models may take together (the default KV cache is a
    share of it).
    """
    reason = refusal(model)
    if reason is not None:
        raise UnsupportedModel(reason)
    model_dir = Path(model.path)
    config = model_files.read_config(model_dir)
    args = dict(model.engine_args)
    max_seq_len = args.get("max_seq_len") or model_files.context_length(config)
    if not isinstance(max_seq_len, int) or max_seq_len < 2:
        raise UnsupportedModel(
            f"model {model.name!r}: its config.json gives no context length; set engine_args.max_seq_len"
        )
    vocab_size = config.get("vocab_size")
    if not isinstance(vocab_size, int) or vocab_size < 1:
        raise UnsupportedModel(f"model {model.name!r}: its config.json gives no vocab_size")
    max_batch_size = int(args.get("max_batch_size") or TRT_MAX_BATCH_SIZE)
    kv_cache = {"enable_block_reuse": True, **args.get("kv_cache_config", {})}
    element_bytes = model_files.DTYPE_BYTES.get(str(kv_cache.get("dtype", "auto")).lower()) or (
        model_files.model_dtype_bytes(config, str(args.get("dtype", "auto")))
    )
    per_token = model_files.kv_bytes_per_token(config, element_bytes)
    weights = model_files.weights_bytes(model_dir)
    kv_cache_bytes = _kv_cache_bytes(
        kv_cache,
        per_token=per_token,
        usable_tokens=max_batch_size * (max_seq_len + TRT_TOKENS_PER_BLOCK),
        one_sequence_tokens=max_seq_len + TRT_TOKENS_PER_BLOCK,
        default_bytes=int(DEFAULT_KV_CACHE_SHARE * memory_budget_bytes),
        free_bytes=max(0, memory_budget_bytes - weights),
    )
    if not kv_cache.get("max_tokens") and not kv_cache.get("max_gpu_total_bytes"):
        kv_cache["max_gpu_total_bytes"] = kv_cache_bytes
    kwargs = {
        "max_seq_len": max_seq_len,
        # Without it, a prompt longer than max_num_tokens is refused by the engine (RequestError).
        "enable_chunked_prefill": True,
        # Structured output (response_format, forced tool calls) needs a backend from the start.
        "guided_decoding_backend": "xgrammar",
        **args,
        "kv_cache_config": kv_cache,
    }
    if model.lora is not None:
        kwargs["lora_config"] = {**lora_kwargs(model.lora), **args.get("lora_config", {})}
    return LoadPlan(
        kwargs=kwargs,
        max_seq_len=max_seq_len,
        max_batch_size=max_batch_size,
        vocab_size=vocab_size,
        weights_bytes=weights,
        kv_cache_bytes=kv_cache_bytes,
    )


def lora_kwargs(lora: LoraConfig) -> dict[str, Any]:
    """TensorRT-LLM's LoraConfig fields from a base's `lora` table: the engine's CPU cache holds as
    many adapters as the controller keeps loaded (`max_cpu_loras`), so that its own LRU never evicts
    one the controller holds; no adapter is named at start (`lora_dir`): each comes with its request."""
    return {
        "lora_dir": [],
        "max_lora_rank": lora.max_rank,
        "max_loras": min(lora.max_adapters_per_batch, lora.max_adapters),
        "max_cpu_loras": lora.max_adapters,
    }


def _kv_cache_bytes(
    kv_cache: dict[str, Any],
    *,
    per_token: int | None,
    usable_tokens: int,
    one_sequence_tokens: int,
    default_bytes: int,
    free_bytes: int,
) -> int:
    """The KV cache's ceiling in bytes: the configuration's bounds, else the default share."""
    bounds: list[int] = []
    if kv_cache.get("max_gpu_total_bytes"):
        bounds.append(int(kv_cache["max_gpu_total_bytes"]))
    if kv_cache.get("max_tokens") and per_token is not None:
        bounds.append(int(kv_cache["max_tokens"]) * per_token)
    if bounds:
        return min(bounds)
    if kv_cache.get("max_tokens"):
        # Tokens of a layout this module cannot size (MLA, hybrid): the free-memory fraction bounds it.
        return int(float(kv_cache.get("free_gpu_memory_fraction", TRT_FREE_GPU_MEMORY_FRACTION)) * free_bytes)
    size = default_bytes
    if per_token is not None:
        size = min(size, usable_tokens * per_token)
        size = max(size, one_sequence_tokens * per_token)
    return math.ceil(size)
