"""The parts of TensorRT-LLM's API the engine relies on, checked against the real one and the stand-in.

Against the real `tensorrt_llm` (where it imports: the GPU image), this catches a TensorRT-LLM
version that renamed or dropped what the engine uses; against the stand-in, it keeps the stand-in
spelled like the real API. Both must pass.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from switchboard.config import ModelConfig
from switchboard.wire import SamplingParams, StructuredOutput
from tests.support import fake_tensorrt_llm
from workers.engines.prompts import BuiltPrompt, PromptBuilder
from workers.engines.trtllm.io import trtllm_sampling
from workers.engines.trtllm.load_plan import GIB, plan_load

# Every knob of our sampling at once, so that every keyword argument the engine can send is checked.
EVERY_KNOB = SamplingParams(
    max_tokens=4,
    temperature=0.7,
    top_p=0.9,
    top_k=20,
    min_p=0.1,
    seed=1,
    stop=("x",),
    n=2,
    presence_penalty=0.1,
    frequency_penalty=0.1,
    repetition_penalty=1.1,
    min_tokens=1,
    logprobs=2,
    echo=True,
)


def _real() -> ModuleType:
    try:
        return importlib.import_module("tensorrt_llm.llmapi")
    except Exception as exc:  # not installed, or installed without the GPU libraries it loads
        pytest.skip(f"needs a GPU and TensorRT-LLM ({exc})")


@pytest.fixture(params=["stand-in", "tensorrt_llm"])
def llmapi(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    if request.param == "stand-in":
        fake_tensorrt_llm.install(monkeypatch)
    yield _real() if request.param == "tensorrt_llm" else importlib.import_module("tensorrt_llm.llmapi")


def field_names(cls: Any) -> set[str]:
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(cls.model_fields)


def test_generate_async_takes_token_ids_sampling_params_and_streaming(llmapi: ModuleType) -> None:
    parameters = inspect.signature(llmapi.LLM.generate_async).parameters
    assert list(parameters)[:3] == ["self", "inputs", "sampling_params"]
    assert "streaming" in parameters
    assert {"model", "tokenizer"} <= set(inspect.signature(llmapi.LLM.__init__).parameters)
    assert callable(llmapi.LLM.shutdown)


def test_adapters_are_configured_and_named_per_request_as_the_engine_does(llmapi: ModuleType) -> None:
    assert "lora_request" in inspect.signature(llmapi.LLM.generate_async).parameters
    lora_manager = importlib.import_module("tensorrt_llm.lora_manager")
    assert {"lora_dir", "max_lora_rank", "max_loras", "max_cpu_loras"} <= field_names(lora_manager.LoraConfig)
    request = importlib.import_module("tensorrt_llm.executor.request")
    assert [f.name for f in dataclasses.fields(request.LoRARequest)][:3] == [
        "lora_name",
        "lora_int_id",
        "lora_path",
    ]


def test_the_request_output_streams_and_aborts(llmapi: ModuleType) -> None:
    output = llmapi.RequestOutput
    assert all(hasattr(output, name) for name in ("__aiter__", "__anext__", "abort", "finished", "outputs"))
    assert {"index", "text", "token_ids", "logprobs", "prompt_logprobs", "finish_reason"} <= field_names(
        llmapi.CompletionOutput
    )


def test_every_sampling_argument_the_engine_sends_exists(llmapi: ModuleType, builder: PromptBuilder) -> None:
    prompt = BuiltPrompt([1, 2, 3], "abc")
    sent = set(trtllm_sampling(EVERY_KNOB, prompt, builder, prompt_param="prompt").kwargs)
    greedy = trtllm_sampling(SamplingParams(temperature=0.0), prompt, builder, prompt_param="prompt")
    sent |= set(greedy.kwargs) | {"guided_decoding", "embedding_bias"}
    assert sent <= field_names(llmapi.SamplingParams)
    assert {"json", "json_object", "regex", "grammar"} <= field_names(llmapi.GuidedDecodingParams)
    guided = trtllm_sampling(
        SamplingParams(structured=StructuredOutput(choice=("a", "b"))), prompt, builder, prompt_param="prompt"
    )
    assert guided.guide is not None
    llmapi.GuidedDecodingParams(**guided.guide)


def test_every_llm_and_kv_cache_argument_the_engine_sends_exists(
    llmapi: ModuleType, demo_model_dir: Path
) -> None:
    model = ModelConfig(name="demo", path=str(demo_model_dir), engine="trtllm")
    plan = plan_load(model, 8 * GIB)
    llm_args = importlib.import_module("tensorrt_llm.llmapi.llm_args")
    assert set(plan.kwargs) | {"model", "tokenizer"} <= set(llm_args.TorchLlmArgs.model_fields)
    kv_cache = plan.kwargs["kv_cache_config"]
    assert set(kv_cache) | {"max_tokens", "free_gpu_memory_fraction", "dtype"} <= field_names(
        llmapi.KvCacheConfig
    )
    llmapi.KvCacheConfig(**kv_cache)
