"""workers.engines.trtllm.load_plan: what a TensorRT-LLM engine is built with, and what it will occupy.

A model folder here is a config.json and a weights file of a known size; nothing is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from switchboard.config import ModelConfig
from workers.engines.trtllm.load_plan import (
    DEFAULT_KV_CACHE_SHARE,
    GIB,
    RUNTIME_OVERHEAD_BYTES,
    TRT_TOKENS_PER_BLOCK,
    UnsupportedModel,
    plan_load,
    refusal,
)

# A Llama-8B-shaped config: 32 layers x 8 KV heads x 128 dims x keys and values x 2 bytes.
LLAMA_8B = {
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
}
PER_TOKEN = 32 * 8 * 128 * 2 * 2
WEIGHTS = 3_000
BUDGET = 72 * GIB


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * WEIGHTS)
    return tmp_path


def model(model_dir: Path, **engine_args: Any) -> ModelConfig:
    return ModelConfig(name="llama", path=str(model_dir), engine="trtllm", engine_args=engine_args)


def test_defaults_bound_the_kv_cache_to_a_share_of_the_budget(model_dir: Path) -> None:
    plan = plan_load(model(model_dir), BUDGET)
    kv_cache = plan.kwargs["kv_cache_config"]
    assert kv_cache == {
        "enable_block_reuse": True,
        "max_gpu_total_bytes": int(DEFAULT_KV_CACHE_SHARE * BUDGET),
    }
    assert plan.kv_cache_bytes == int(DEFAULT_KV_CACHE_SHARE * BUDGET)
    assert plan.footprint_bytes == WEIGHTS + plan.kv_cache_bytes + RUNTIME_OVERHEAD_BYTES
    assert plan.kwargs["max_seq_len"] == 131072  # from the config: limits() needs it in the worker
    assert plan.kwargs["enable_chunked_prefill"] is True
    assert plan.kwargs["guided_decoding_backend"] == "xgrammar"
    assert plan.structured_output and plan.vocab_size == 128256


def test_two_models_fit_where_the_free_memory_fraction_alone_would_refuse_the_second(model_dir: Path) -> None:
    # Left to TensorRT-LLM's default, the first model would take 90 % of the memory free after
    # its weights, and the second would find a tenth of it: each model is bounded here instead.
    plan = plan_load(model(model_dir), BUDGET)
    assert 2 * plan.footprint_bytes <= BUDGET
    assert plan.kwargs["kv_cache_config"]["max_gpu_total_bytes"] < 0.9 * (BUDGET - WEIGHTS)


def test_the_default_kv_cache_is_no_larger_than_its_sequences_can_use(model_dir: Path) -> None:
    plan = plan_load(model(model_dir, max_batch_size=4, max_seq_len=1024), BUDGET)
    assert plan.kv_cache_bytes == 4 * (1024 + TRT_TOKENS_PER_BLOCK) * PER_TOKEN
    assert plan.kwargs["kv_cache_config"]["max_gpu_total_bytes"] == plan.kv_cache_bytes


def test_the_default_kv_cache_holds_at_least_one_sequence(model_dir: Path) -> None:
    plan = plan_load(model(model_dir, max_seq_len=8192), 1 * GIB)
    assert plan.kv_cache_bytes == (8192 + TRT_TOKENS_PER_BLOCK) * PER_TOKEN


def test_a_kv_cache_bounded_in_tokens_is_counted_in_bytes(model_dir: Path) -> None:
    plan = plan_load(model(model_dir, kv_cache_config={"max_tokens": 10_000}), BUDGET)
    assert plan.kv_cache_bytes == 10_000 * PER_TOKEN
    assert plan.kwargs["kv_cache_config"] == {"enable_block_reuse": True, "max_tokens": 10_000}


def test_a_kv_cache_bounded_in_bytes_is_taken_as_it_is(model_dir: Path) -> None:
    config = {"max_gpu_total_bytes": 5 * GIB, "max_tokens": 10**9, "enable_block_reuse": False}
    plan = plan_load(model(model_dir, kv_cache_config=config), BUDGET)
    assert plan.kv_cache_bytes == 5 * GIB  # the smaller bound wins, as in TensorRT-LLM
    assert plan.kwargs["kv_cache_config"] == config


def test_a_free_memory_fraction_alone_is_still_bounded_by_the_default(model_dir: Path) -> None:
    plan = plan_load(model(model_dir, kv_cache_config={"free_gpu_memory_fraction": 0.5}), BUDGET)
    assert plan.kwargs["kv_cache_config"]["max_gpu_total_bytes"] == plan.kv_cache_bytes
    assert plan.kwargs["kv_cache_config"]["free_gpu_memory_fraction"] == 0.5


def test_an_fp8_kv_cache_takes_half_the_bytes_per_token(model_dir: Path) -> None:
    plan = plan_load(model(model_dir, kv_cache_config={"max_tokens": 1000, "dtype": "fp8"}), BUDGET)
    assert plan.kv_cache_bytes == 1000 * PER_TOKEN // 2


def test_engine_args_pass_through_over_the_defaults(model_dir: Path) -> None:
    args = {
        "max_seq_len": 4096,
        "enable_chunked_prefill": False,
        "guided_decoding_backend": None,
        "dtype": "float16",
    }
    plan = plan_load(model(model_dir, **args), BUDGET)
    assert {name: plan.kwargs[name] for name in args} == args
    assert plan.max_seq_len == 4096 and not plan.structured_output


def test_a_model_without_a_context_length_must_say_it(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 10, "num_hidden_layers": 1}))
    with pytest.raises(UnsupportedModel, match="max_seq_len"):
        plan_load(model(tmp_path), BUDGET)
    assert plan_load(model(tmp_path, max_seq_len=512), BUDGET).max_seq_len == 512


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"tool_call_parser": "hermes"}, "does not parse tool calls"),
        ({"engine_args": {"backend": "tensorrt"}}, "PyTorch backend"),
        ({"engine_args": {"tokenizer": "/elsewhere"}}, "may not set tokenizer"),
        ({"engine_args": {"model": "/elsewhere"}}, "may not set model"),
        ({"engine_args": {"kv_cache_config": 0.5}}, "table of KvCacheConfig fields"),
    ],
)
def test_what_the_engine_cannot_do_is_refused_before_loading(
    model_dir: Path, fields: dict[str, Any], words: str
) -> None:
    configured = ModelConfig(name="llama", path=str(model_dir), engine="trtllm", **fields)
    reason = refusal(configured)
    assert reason is not None and words in reason and "'llama'" in reason
    with pytest.raises(UnsupportedModel, match=words):
        plan_load(configured, BUDGET)


def test_the_pytorch_backend_named_explicitly_is_fine(model_dir: Path) -> None:
    assert refusal(model(model_dir, backend="pytorch")) is None
