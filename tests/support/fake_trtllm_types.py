"""The data types of the TensorRT-LLM stand-in, spelled as TensorRT-LLM 1.2 spells them.

`SamplingParams`, `GuidedDecodingParams`, `CompletionOutput` (with its `*_diff` counters),
`KvCacheConfig` (strict, as the pydantic original), `TorchLlmArgs`'s fields, and the executor's
responses; see fake_tensorrt_llm.py for what they stand in for.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

# TorchLlmArgs fields (llm_args.py, 1.2): the arguments the PyTorch backend's LLM accepts.
TORCH_LLM_ARGS = frozenset(
    """
    model tokenizer tokenizer_mode skip_tokenizer_init trust_remote_code tensor_parallel_size dtype
    revision tokenizer_revision pipeline_parallel_size context_parallel_size gpus_per_node
    moe_expert_parallel_size enable_attention_dp max_batch_size max_num_tokens max_seq_len
    max_beam_width max_input_len kv_cache_config enable_chunked_prefill guided_decoding_backend
    scheduler_config cuda_graph_config disable_overlap_scheduler attn_backend moe_config
    stream_interval num_postprocess_workers postprocess_tokenizer_dir enable_iter_perf_stats
    enable_iter_req_stats return_perf_metrics print_iter_log otlp_traces_endpoint load_format
    speculative_config lora_config backend sampler_type enable_autotuner torch_compile_config
    batch_wait_timeout_ms checkpoint_format peft_cache_config reasoning_parser
    """.split()  # noqa: SIM905 (a list of names, written as one)
)
# Fields of the TensorRT backend's args that `_validate_args_for_torch_backend` refuses.
TRT_BACKEND_ONLY_ARGS = frozenset({"build_config", "enable_build_cache", "calib_config", "fast_build"})


@dataclass
class Faults:
    """What tests make the stand-in do."""

    build_seconds: float = 0.3  # weights and warm-up, after the executor process started
    build_error: Exception | None = None  # raised by LLM(...) at the end of its build
    step_seconds: float = 0.002  # one iteration of the executor
    ignore_aborts: bool = False  # an aborted request never gets its final output
    leave_processes: bool = False  # shutdown (or a failed build) leaves the executor process


class TorchLlmArgs:
    """`tensorrt_llm.llmapi.llm_args.TorchLlmArgs`: its fields are the arguments `LLM` accepts."""

    model_fields: ClassVar[dict[str, Any]] = dict.fromkeys(TORCH_LLM_ARGS)


@dataclass
class LoraConfig:
    """`tensorrt_llm.lora_manager.LoraConfig`: the fields the engine sets."""

    lora_dir: list[str] = field(default_factory=list)
    lora_ckpt_source: str = "hf"
    max_lora_rank: int = 64
    lora_target_modules: list[str] = field(default_factory=list)
    max_loras: int | None = None
    max_cpu_loras: int | None = None


@dataclass(slots=True)
class LoRARequest:
    """`tensorrt_llm.executor.request.LoRARequest`: refuses a path that does not exist, as the real one."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self) -> None:
        if not os.path.exists(self.lora_path):
            raise ValueError(f"lora_path ({self.lora_path}) does not exist.")


class RequestError(RuntimeError):
    """A request the executor refused (`tensorrt_llm.executor.utils.RequestError`)."""


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    prompt_logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    finish_reason: Literal["stop", "length", "timeout", "cancelled"] | None = None
    stop_reason: int | str | None = None
    _last_text_len: int = field(default=0, init=False, repr=False)
    _last_token_ids_len: int = field(default=0, init=False, repr=False)
    _last_logprobs_len: int = field(default=0, init=False, repr=False)

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len :]

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len :]

    @property
    def logprobs_diff(self) -> list[dict[int, Logprob]]:
        return self.logprobs[self._last_logprobs_len :]


@dataclass(slots=True, kw_only=True)
class GuidedDecodingParams:
    json: Any = None
    regex: str | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | None = None

    def _validate(self) -> None:
        guides = sum(bool(getattr(self, f.name)) for f in dataclasses.fields(self))
        if guides > 1:
            raise ValueError(f"Only one guide can be used for a request, but got {guides}.")


@dataclass(kw_only=True)
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    embedding_bias: Any = None
    n: int = 1
    best_of: int | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_p: float | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    return_perf_metrics: bool = False
    guided_decoding: GuidedDecodingParams | None = None
    ignore_eos: bool = False
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    _stop_word_ids: list[list[int]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.pad_id is None:
            self.pad_id = self.end_id
        self.best_of = self.best_of or self.n
        self._validate()

    def _validate(self) -> None:
        assert self.best_of is not None
        if self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) cannot be less than n ({self.n})")
        if self.best_of > 1 and self._greedy_decoding and not os.environ.get("TLLM_ALLOW_N_GREEDY_DECODING"):
            raise ValueError("Greedy decoding in the LLM API does not allow multiple returns.")
        if self.guided_decoding is not None:
            self.guided_decoding._validate()
        self.logprobs = self.logprobs and int(self.logprobs)
        self.prompt_logprobs = self.prompt_logprobs and int(self.prompt_logprobs)

    @property
    def _greedy_decoding(self) -> bool:
        unset = self.temperature is None and self.top_p is None and self.top_k is None
        return not self.use_beam_search and (
            unset or self.temperature == 0 or self.top_k == 1 or self.top_p == 0.0
        )

    def _setup(self, tokenizer: Any) -> SamplingParams:
        if self.end_id is None:
            self.end_id = tokenizer.eos_token_id
            self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.end_id
        if self.stop is not None:
            stops = [self.stop] if isinstance(self.stop, str) else self.stop
            self._stop_word_ids = [tokenizer.encode(s, add_special_tokens=False) for s in stops]
        return self

    def _get_stop_reasons_and_words(self) -> list[tuple[int | str, list[int]]]:
        reasons: list[int | str] = list(self.stop_token_ids or ())
        words = [[token] for token in self.stop_token_ids or ()]
        if self.stop is not None:
            reasons += [self.stop] if isinstance(self.stop, str) else self.stop
            words += self._stop_word_ids or []
        return list(zip(reasons, words, strict=False))


class KvCacheConfig:
    """A pydantic model in TensorRT-LLM: unknown fields and out-of-range values are refused."""

    model_fields: ClassVar[dict[str, Any]] = {
        "enable_block_reuse": True,
        "max_tokens": None,
        "max_attention_window": None,
        "sink_token_length": None,
        "free_gpu_memory_fraction": 0.9,
        "host_cache_size": None,
        "onboard_blocks": True,
        "cross_kv_cache_fraction": None,
        "secondary_offload_min_priority": None,
        "event_buffer_max_size": 0,
        "enable_partial_reuse": True,
        "copy_on_partial_reuse": True,
        "use_uvm": False,
        "max_gpu_total_bytes": 0,
        "dtype": "auto",
        "tokens_per_block": 32,
    }

    def __init__(self, **data: Any) -> None:
        unknown = sorted(set(data) - set(self.model_fields))
        if unknown:
            raise ValueError(f"KvCacheConfig: extra inputs are not permitted: {unknown}")
        for name, default in self.model_fields.items():
            setattr(self, name, data.get(name, default))
        if self.free_gpu_memory_fraction is not None and not 0 <= self.free_gpu_memory_fraction <= 1:
            raise ValueError("kv_cache_config.free_gpu_memory_fraction must be a float between 0 and 1")
        if self.max_gpu_total_bytes < 0:
            raise ValueError("kv_cache_config.max_gpu_total_bytes must be non-negative")


class FinishReason:
    """`tensorrt_llm.bindings.executor.FinishReason`."""

    NOT_FINISHED, END_ID, STOP_WORDS, LENGTH, TIMED_OUT, CANCELLED = range(6)


@dataclass
class Response:
    """One response of the executor: new tokens of one sequence (`tllm.Response.result`)."""

    sequence_index: int
    output_token_ids: list[list[int]]
    finish_reasons: list[int]
    is_final: bool
    log_probs: list[list[dict[int, Logprob]]] | None = None
    prompt_logprobs: list[dict[int, Logprob]] | None = None
    error: str | None = None
