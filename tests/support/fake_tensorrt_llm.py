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

`install(monkeypatch)` puts it in `sys.modules` as `tensorrt_llm` (and `.llmapi`,
`.llmapi.llm_args`, `.executor`, `.sampling_params`) and returns the Faults that tests turn on
(build errors, aborts ignored, processes left behind). Its data types are in fake_trtllm_types.py,
its executor in fake_trtllm_executor.py, its "weights" in fake_trtllm_model.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
import types
from typing import Any, ClassVar

import pytest

from tests.support.fake_trtllm_executor import Executor
from tests.support.fake_trtllm_model import ToyModel
from tests.support.fake_trtllm_types import (
    TRT_BACKEND_ONLY_ARGS,
    CompletionOutput,
    Faults,
    FinishReason,
    GuidedDecodingParams,
    KvCacheConfig,
    LoraConfig,
    LoRARequest,
    RequestError,
    Response,
    SamplingParams,
    TorchLlmArgs,
)

VERSION = "1.2.1+stand-in"
# BuildConfig's defaults, which the PyTorch backend inherits.
DEFAULT_MAX_BATCH_SIZE = 2048
DEFAULT_MAX_NUM_TOKENS = 8192
# The executor's process: sleeps until its parent is gone.
EXECUTOR_SCRIPT = (
    "import os, time\nparent = os.getppid()\nwhile os.getppid() == parent:\n    time.sleep(0.2)\n"
)


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
            self.aqueue: asyncio.Queue[Response] | None = asyncio.Queue()
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

    def _deliver(self, response: Response) -> None:
        """From the executor's thread, as the real result queue does it."""
        if self._loop is not None and self.aqueue is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody reads any more
                self._loop.call_soon_threadsafe(self.aqueue.put_nowait, response)

    def _handle_response(self, response: Response) -> None:
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

    def _handle_sequence(self, response: Response) -> None:
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
        # Each request's adapter (None for the base alone), in order.
        self.lora_requests: list[Any] = []
        faults = self.faults
        self._process = subprocess.Popen([sys.executable, "-I", "-S", "-c", EXECUTOR_SCRIPT])
        try:
            time.sleep(faults.build_seconds)
            if faults.build_error is not None:
                raise faults.build_error
        except BaseException:
            self._stop_process()
            raise
        self._executor = Executor(self, ToyModel(config.vocab_size), faults)
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
        ids = list(inputs["prompt_token_ids"] if isinstance(inputs, dict) else inputs)
        # As 1.2's `BaseLLM._check_arguments` on the PyTorch backend: only the prompt against one
        # step's tokens, refused with a RequestError (n against max_batch_size is the TensorRT
        # backend's check, not this one's).
        prompt_len = len(ids)
        if not self.args.enable_chunked_prefill and prompt_len > self.args.max_num_tokens:
            raise RequestError(
                f"The sum of prompt length ({float(prompt_len)}), query length (0) should not exceed "
                f"max_num_tokens ({self.args.max_num_tokens})"
            )
        if lora_request is not None and "lora_config" not in self.args.kwargs:
            raise ValueError("LoRA request given, but the LLM has no lora_config")
        self.lora_requests.append(lora_request)
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
        "tensorrt_llm.lora_manager": _module("tensorrt_llm.lora_manager", LoraConfig=LoraConfig),
        "tensorrt_llm.executor.request": _module("tensorrt_llm.executor.request", LoRARequest=LoRARequest),
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
