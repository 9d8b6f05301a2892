"""A stand-in for TensorRT-LLM's LLM API (1.x, PyTorch backend), for machines without a GPU.

Built from the names and behaviours of the modules it stands in for, as read in TensorRT-LLM's
sources (`llmapi/llm.py`, `llmapi/llm_args.py`, `executor/result.py`, `sampling_params.py`):
- `LLM(model, tokenizer=..., **kwargs)` refuses any argument TorchLlmArgs does not have
  (ValueError "LLM got invalid argument"), and TensorRT-backend-only ones; it starts its executor
  in a process of its own (here a sleeping child that ends with its parent) before loading.
- `generate_async(...)` returns a RequestOutput at once; its queue is an asyncio one only when it
  was made on an event loop's thread. Responses arrive from another thread, one per sequence: for
  n > 1 they interleave, and `_last_token_ids_len` moves only for the sequence of the response, so
  the other choices' `token_ids_diff` go stale, as in the real `_handle_sequence`. Finish reasons
  are set only on the request's final response.
- Stop strings are found in the detokenized text after it was streamed (the text shrinks to the
  stop string's start, the request is aborted and done); stop words also end a sequence at the
  token level. An abort ends the request with `cancelled` outputs; an unset seed is 0.
- `SamplingParams` defaults `max_tokens` to 32 and refuses several greedy choices.
Not modelled: penalties, beam search, prompt tuning, LoRA, disaggregated serving.

`install(monkeypatch)` puts it in `sys.modules` as `tensorrt_llm` (and `.llmapi`, `.executor`,
`.sampling_params`) and returns the Faults that tests turn on (build errors, aborts ignored, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import subprocess
import sys
import threading
import time
import types
from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import pytest

from tests.support.fake_trtllm_model import ToyModel, UnsupportedGuide, guided_text, log_softmax, top_logprobs

VERSION = "1.2.1+stand-in"
# TorchLlmArgs fields (llm_args.py, 1.2): the arguments the PyTorch backend's LLM accepts.
TORCH_LLM_ARGS = frozenset(
    {
        "model",
        "tokenizer",
        "tokenizer_mode",
        "skip_tokenizer_init",
        "trust_remote_code",
        "tensor_parallel_size",
        "dtype",
        "revision",
        "tokenizer_revision",
        "pipeline_parallel_size",
        "context_parallel_size",
        "gpus_per_node",
        "moe_expert_parallel_size",
        "enable_attention_dp",
        "max_batch_size",
        "max_num_tokens",
        "max_seq_len",
        "max_beam_width",
        "max_input_len",
        "kv_cache_config",
        "enable_chunked_prefill",
        "guided_decoding_backend",
        "scheduler_config",
        "cuda_graph_config",
        "disable_overlap_scheduler",
        "attn_backend",
        "moe_config",
        "stream_interval",
        "num_postprocess_workers",
        "postprocess_tokenizer_dir",
        "enable_iter_perf_stats",
        "enable_iter_req_stats",
        "return_perf_metrics",
        "print_iter_log",
        "otlp_traces_endpoint",
        "load_format",
        "speculative_config",
        "lora_config",
        "backend",
        "sampler_type",
        "enable_autotuner",
        "torch_compile_config",
        "batch_wait_timeout_ms",
        "checkpoint_format",
        "peft_cache_config",
        "reasoning_parser",
    }
)
# Fields of the TensorRT backend's args that `_validate_args_for_torch_backend` refuses.
TRT_BACKEND_ONLY_ARGS = frozenset({"build_config", "enable_build_cache", "calib_config", "fast_build"})
# BuildConfig's defaults, which the PyTorch backend inherits.
DEFAULT_MAX_BATCH_SIZE = 2048
DEFAULT_MAX_NUM_TOKENS = 8192
# The executor's process: sleeps until its parent is gone.
EXECUTOR_SCRIPT = (
    "import os, time\nparent = os.getppid()\nwhile os.getppid() == parent:\n    time.sleep(0.2)\n"
)


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
class _Response:
    """One response of the executor: new tokens of one sequence (`tllm.Response.result`)."""

    sequence_index: int
    output_token_ids: list[list[int]]
    finish_reasons: list[int]
    is_final: bool
    log_probs: list[list[dict[int, Logprob]]] | None = None
    prompt_logprobs: list[dict[int, Logprob]] | None = None
    error: str | None = None


class RequestOutput:
    """What `generate_async` returns: mutated and yielded again on every response."""

    def __init__(
        self, llm: LLM, request_id: int, prompt_token_ids: list[int], params: SamplingParams
    ) -> None:
        self._llm = llm
        self.id = request_id
        self.sampling_params = params
        self._prompt_token_ids = prompt_token_ids
        assert params.best_of is not None
        self._outputs = [CompletionOutput(i) for i in range(params.best_of)]
        self._done = False
        self._aborted = False
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            self.aqueue: asyncio.Queue[_Response] | None = asyncio.Queue()
        except RuntimeError:  # made off the loop's thread: no async iteration (as the real one)
            self._loop, self.aqueue = None, None

    @property
    def request_id(self) -> int:
        return self.id

    @property
    def prompt_token_ids(self) -> list[int]:
        return self._prompt_token_ids

    @property
    def outputs(self) -> list[CompletionOutput]:
        return self._outputs[: self.sampling_params.n]

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        self._llm._executor.abort_request(self.id)
        self._aborted = True

    def aborted(self) -> bool:
        return self._aborted

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        assert self.aqueue is not None, (
            "The asyncio event loop was not present during initialization, so async operations are not available."
        )
        self._handle_response(await self.aqueue.get())
        return self

    def _deliver(self, response: _Response) -> None:
        """From the executor's thread, as the real result queue does it."""
        if self._loop is not None and self.aqueue is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody reads any more
                self._loop.call_soon_threadsafe(self.aqueue.put_nowait, response)

    def _handle_response(self, response: _Response) -> None:
        if response.error is not None:
            raise RequestError(response.error)
        self._done = response.is_final
        self._handle_sequence(response)
        params = self.sampling_params
        tokenizer = self._llm.tokenizer.tokenizer
        for output in self.outputs:
            output._last_text_len = len(output.text)
            output.text = tokenizer.decode(output.token_ids, skip_special_tokens=params.skip_special_tokens)
            if not self._done or output.finish_reason in ("stop", "length"):
                for reason, _ in params._get_stop_reasons_and_words():
                    if isinstance(reason, str) and reason in output.text:
                        output.text = output.text[: output.text.find(reason)]
                        output.finish_reason, output.stop_reason = "stop", reason
                        self.abort()
                        self._done = True
                        break

    def _handle_sequence(self, response: _Response) -> None:
        output = self._outputs[response.sequence_index]
        output._last_token_ids_len = len(output.token_ids)
        output.token_ids.extend(response.output_token_ids[0])
        if response.log_probs is not None:
            output._last_logprobs_len = len(output.logprobs)
            output.logprobs += response.log_probs[0][output._last_logprobs_len :]
        if response.prompt_logprobs is not None:
            output.prompt_logprobs = response.prompt_logprobs
        reason = response.finish_reasons[0]
        if reason == FinishReason.CANCELLED:
            output.finish_reason = "cancelled"
        if self._done:
            if reason == FinishReason.END_ID:
                output.finish_reason = "stop"
            elif reason == FinishReason.STOP_WORDS:
                output.finish_reason = "stop"
                for stop_reason, stop_ids in self.sampling_params._get_stop_reasons_and_words():
                    if stop_ids and output.token_ids[-len(stop_ids) :] == stop_ids:
                        output.stop_reason = stop_reason
                        output.token_ids = output.token_ids[: -len(stop_ids)]
                        break
            elif reason == FinishReason.LENGTH:
                output.finish_reason = "length"
            elif reason == FinishReason.TIMED_OUT:
                output.finish_reason = "timeout"


class TransformersTokenizer:
    """`tensorrt_llm.llmapi.tokenizer.TransformersTokenizer`: the HF tokenizer is its `.tokenizer`."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


class LLM:
    """`tensorrt_llm.LLM` (the PyTorch backend's)."""

    instances: ClassVar[list[LLM]] = []
    faults: ClassVar[Faults] = Faults()

    def __init__(self, model: str, tokenizer: Any = None, **kwargs: Any) -> None:
        for name in kwargs:
            if name not in TorchLlmArgs.model_fields:
                if name in TRT_BACKEND_ONLY_ARGS:
                    raise ValueError(f"{name} is not supported by the PyTorch backend")
                raise ValueError(f"LLM got invalid argument: {name}")
        from transformers import AutoConfig, AutoTokenizer

        config = AutoConfig.from_pretrained(model)
        hf_tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(model)
        kv_cache = kwargs.get("kv_cache_config") or KvCacheConfig()
        if isinstance(kv_cache, dict):
            kv_cache = KvCacheConfig(**kv_cache)
        self.args = types.SimpleNamespace(
            model=model,
            max_seq_len=kwargs.get("max_seq_len") or config.max_position_embeddings,
            max_batch_size=kwargs.get("max_batch_size") or DEFAULT_MAX_BATCH_SIZE,
            max_num_tokens=kwargs.get("max_num_tokens") or DEFAULT_MAX_NUM_TOKENS,
            enable_chunked_prefill=bool(kwargs.get("enable_chunked_prefill", False)),
            guided_decoding_backend=kwargs.get("guided_decoding_backend"),
            kv_cache_config=kv_cache,
            kwargs=dict(kwargs),
        )
        self.tokenizer = TransformersTokenizer(hf_tokenizer)
        self._shut_down = False
        self._next_id = 0
        faults = self.faults
        self._process = subprocess.Popen([sys.executable, "-I", "-S", "-c", EXECUTOR_SCRIPT])
        try:
            time.sleep(faults.build_seconds)
            if faults.build_error is not None:
                raise faults.build_error
        except BaseException:
            self._stop_process()
            raise
        self._executor = _Executor(self, ToyModel(config.vocab_size), faults)
        LLM.instances.append(self)

    def generate_async(
        self,
        inputs: Any,
        sampling_params: SamplingParams | None = None,
        lora_request: Any = None,
        prompt_adapter_request: Any = None,
        streaming: bool = False,
        kv_cache_retention_config: Any = None,
        disaggregated_params: Any = None,
        trace_headers: Any = None,
        _postproc_params: Any = None,
        scheduling_params: Any = None,
        cache_salt: str | None = None,
    ) -> RequestOutput:
        if self._shut_down:
            raise RuntimeError("LLM is shutting down")
        params = sampling_params if sampling_params is not None else SamplingParams()
        if params.end_id is None:
            params._setup(self.tokenizer.tokenizer)
        if params.n > self.args.max_batch_size:
            raise ValueError(f"SamplingParams.n ({params.n}) should not exceed max_batch_size")
        if params.guided_decoding is not None and self.args.guided_decoding_backend is None:
            raise ValueError("guided decoding needs guided_decoding_backend set when the LLM is built")
        ids = list(inputs["prompt_token_ids"] if isinstance(inputs, dict) else inputs)
        prompt_len = len(ids)
        if not self.args.enable_chunked_prefill and prompt_len > self.args.max_num_tokens:
            raise ValueError(f"The sum of prompt length ({prompt_len}) should not exceed max_num_tokens")
        self._next_id += 1
        result = RequestOutput(self, self._next_id, ids, params)
        self._executor.submit(result)
        return result

    def shutdown(self) -> None:
        if self._shut_down:
            return
        self._shut_down = True
        self._executor.stop()
        self._stop_process()

    def _stop_process(self) -> None:
        if not self.faults.leave_processes:
            self._process.kill()
            self._process.wait()


@dataclass
class _Sequence:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    forced: list[int] | None = None  # a guided document's tokens, then the end token
    done: bool = False


class _Executor:
    """The executor process, as a thread: batches of at most max_batch_size sequences, one token per step."""

    def __init__(self, llm: LLM, model: ToyModel, faults: Faults) -> None:
        self._llm = llm
        self._model = model
        self._faults = faults
        self._lock = threading.Lock()
        self._waiting: deque[RequestOutput] = deque()
        self._running: dict[int, tuple[RequestOutput, list[_Sequence], list[np.random.Generator]]] = {}
        self._aborted: set[int] = set()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="FakeTrtExecutor", daemon=True)
        self._thread.start()

    def submit(self, result: RequestOutput) -> None:
        with self._lock:
            self._waiting.append(result)

    def abort_request(self, request_id: int) -> None:
        with self._lock:
            self._aborted.add(request_id)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stopping.wait(self._faults.step_seconds):
            with self._lock:
                self._step()

    def _step(self) -> None:
        for result in [r for r in self._waiting if r.id in self._aborted]:
            self._waiting.remove(result)
            self._cancel(result, [_Sequence() for _ in range(result.sampling_params.n)])
        capacity = self._llm.args.max_batch_size - sum(len(s) for _, s, _ in self._running.values())
        while self._waiting and self._waiting[0].sampling_params.n <= capacity:
            result = self._waiting.popleft()
            capacity -= result.sampling_params.n
            self._admit(result)
        for request_id, (result, sequences, rngs) in list(self._running.items()):
            if request_id in self._aborted:
                del self._running[request_id]
                self._cancel(result, sequences)
                continue
            for index, sequence in enumerate(sequences):
                if not sequence.done:
                    self._advance(result, sequences, index, rngs[index])
            if all(s.done for s in sequences):
                del self._running[request_id]

    def _admit(self, result: RequestOutput) -> None:
        params = result.sampling_params
        seed = params.seed if params.seed is not None else 0  # TensorRT-LLM's default seed
        rngs = [np.random.default_rng([seed, index]) for index in range(params.n)]
        sequences = [_Sequence() for _ in range(params.n)]
        if len(result.prompt_token_ids) + params.max_tokens > self._llm.args.max_seq_len:
            result._deliver(
                _error(f"prompt and max_tokens exceed max_seq_len ({self._llm.args.max_seq_len})")
            )
            return
        if params.guided_decoding is not None:
            for sequence, rng in zip(sequences, rngs, strict=True):
                try:
                    text = guided_text(params.guided_decoding, rng)
                except UnsupportedGuide as exc:
                    result._deliver(_error(str(exc)))
                    return
                tokenizer = self._llm.tokenizer.tokenizer
                sequence.forced = [*tokenizer.encode(text, add_special_tokens=False), params.end_id]
        self._running[result.id] = (result, sequences, rngs)

    def _advance(
        self, result: RequestOutput, sequences: list[_Sequence], index: int, rng: np.random.Generator
    ) -> None:
        params = result.sampling_params
        sequence = sequences[index]
        context = [*result.prompt_token_ids, *sequence.tokens]
        bias = None if params.embedding_bias is None else np.asarray(params.embedding_bias, dtype=np.float64)
        early = params.min_tokens is not None and len(sequence.tokens) < params.min_tokens
        banned = [params.end_id] if early and params.end_id is not None else []
        token, logprobs = self._model.next_token(context, params, rng, bias=bias, banned=banned)
        if sequence.forced is not None:
            token = sequence.forced[len(sequence.tokens)]
        sequence.tokens.append(token)
        if params.logprobs:
            ranked = top_logprobs(logprobs, params.logprobs, token)
            sequence.logprobs.append({t: Logprob(lp, rank) for t, (lp, rank) in ranked.items()})
        reason = FinishReason.NOT_FINISHED
        if token == params.end_id and not params.ignore_eos:
            reason = FinishReason.END_ID
        elif any(words and sequence.tokens[-len(words) :] == words for words in params._stop_word_ids or ()):
            reason = FinishReason.STOP_WORDS
        elif len(sequence.tokens) >= params.max_tokens:
            reason = FinishReason.LENGTH
        sequence.done = reason != FinishReason.NOT_FINISHED
        response = _Response(
            sequence_index=index,
            output_token_ids=[[token]],
            finish_reasons=[reason],
            is_final=all(s.done for s in sequences),
            log_probs=[list(sequence.logprobs)] if params.logprobs else None,
            prompt_logprobs=self._prompt_logprobs(result) if len(sequence.tokens) == 1 else None,
        )
        result._deliver(response)

    def _prompt_logprobs(self, result: RequestOutput) -> list[dict[int, Logprob]] | None:
        """From the context logits: entry t is the distribution after prompt token t (top k only)."""
        k = result.sampling_params.prompt_logprobs
        if not k:
            return None
        ids = result.prompt_token_ids
        entries = []
        for end in range(1, len(ids) + 1):
            logprobs = log_softmax(self._model.logits(ids[:end]))
            entries.append(
                {t: Logprob(lp, rank) for t, (lp, rank) in top_logprobs(logprobs, k, None).items()}
            )
        return entries

    def _cancel(self, result: RequestOutput, sequences: list[_Sequence]) -> None:
        if self._faults.ignore_aborts:
            return  # the request never ends
        pending = [index for index, sequence in enumerate(sequences) if not sequence.done]
        for position, index in enumerate(pending):
            final = position == len(pending) - 1
            result._deliver(_Response(index, [[]], [FinishReason.CANCELLED], is_final=final))


def _error(message: str) -> _Response:
    return _Response(0, [[]], [FinishReason.NOT_FINISHED], is_final=True, error=message)


def _module(name: str, **names: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(names)
    module.__path__ = []  # a package, so that submodules import
    return module


def install(monkeypatch: pytest.MonkeyPatch) -> Faults:
    """Make `import tensorrt_llm` find the stand-in (until the monkeypatch is undone); its Faults."""
    LLM.instances = []
    LLM.faults = Faults()
    shared = {
        "LLM": LLM,
        "SamplingParams": SamplingParams,
        "GuidedDecodingParams": GuidedDecodingParams,
        "KvCacheConfig": KvCacheConfig,
        "RequestError": RequestError,
        "CompletionOutput": CompletionOutput,
        "RequestOutput": RequestOutput,
    }
    root = _module("tensorrt_llm", __version__=VERSION, **shared)
    modules = {
        "tensorrt_llm": root,
        "tensorrt_llm.llmapi": _module("tensorrt_llm.llmapi", **shared),
        "tensorrt_llm.llmapi.llm_args": _module(
            "tensorrt_llm.llmapi.llm_args", TorchLlmArgs=TorchLlmArgs, KvCacheConfig=KvCacheConfig
        ),
        "tensorrt_llm.executor": _module(
            "tensorrt_llm.executor", CompletionOutput=CompletionOutput, RequestError=RequestError
        ),
        "tensorrt_llm.sampling_params": _module(
            "tensorrt_llm.sampling_params",
            SamplingParams=SamplingParams,
            GuidedDecodingParams=GuidedDecodingParams,
        ),
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, module)
    return LLM.faults
