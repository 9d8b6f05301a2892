"""vLLM's AsyncLLM behind the engine interface (the GPU build, or vLLM's CPU build without a GPU)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from switchboard.config import ModelConfig
from workers.engines.base import Delta, Engine, EngineRequest, Footprint, InvalidEngineRequest

logger = logging.getLogger(__name__)

GIB = 1024**3


class VllmEngine(Engine):
    """One model in one vLLM AsyncLLM."""

    def __init__(self, model: ModelConfig, *, cpu_threads: str | None, cpu_kvcache_gib: float) -> None:
        super().__init__(model)
        self._cpu_threads = cpu_threads
        self._cpu_kvcache_gib = cpu_kvcache_gib
        self._llm: Any = None
        self._tokenizer: Any = None
        self._max_model_len = 0
        self._device = "cpu"
        self.start_seconds = 0.0

    async def start(self) -> None:
        """Build the AsyncLLM off the event loop (it takes tens of seconds), then warm its tokenizer."""
        started = time.monotonic()
        self._llm = await asyncio.to_thread(self._build)
        self._tokenizer = self._llm.get_tokenizer()
        self._max_model_len = self._llm.model_config.max_model_len
        self.start_seconds = time.monotonic() - started
        logger.info(
            "engine started",
            extra={"model": self.model.name, "seconds": round(self.start_seconds, 1), "device": self._device},
        )

    def _build(self) -> Any:
        self._prepare_cpu_environment()
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        self._device = "cpu" if current_platform.is_cpu() else str(current_platform.device_type)
        args = AsyncEngineArgs(model=self.model.path, **self.model.engine_args)
        return AsyncLLM.from_engine_args(args)

    def _prepare_cpu_environment(self) -> None:
        # Read by vLLM's CPU build when its engine process starts; harmless on GPU builds.
        # The KV cache must be small: vLLM sizes itself from NUMA node 0, which can be far smaller
        # than the machine, and refuses to start when most of it is not free.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{self._cpu_kvcache_gib:g}")
        if self._cpu_threads is not None:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = self._cpu_threads

    async def generate(self, request: EngineRequest) -> AsyncIterator[Delta]:
        """Stream deltas; the prompt is tokenized here with the model's own tokenizer and template."""
        from vllm.inputs import TokensPrompt

        prompt_ids = self._prompt_token_ids(request)
        params = self._sampling_params(request, len(prompt_ids))
        completion_tokens = 0
        stream = self._llm.generate(TokensPrompt(prompt_token_ids=prompt_ids), params, request.request_id)
        async for output in stream:
            completion = output.outputs[0]
            completion_tokens += len(completion.token_ids)
            finish = completion.finish_reason if output.finished else None
            yield Delta(
                text=completion.text,
                prompt_tokens=len(prompt_ids),
                completion_tokens=completion_tokens,
                finish_reason=_finish_reason(finish),
            )

    def _prompt_token_ids(self, request: EngineRequest) -> list[int]:
        if request.messages is not None:
            conversation = [{"role": m.role, "content": m.content} for m in request.messages]
            try:
                text = self._tokenizer.apply_chat_template(
                    conversation, add_generation_prompt=True, tokenize=False
                )
            except ValueError as exc:  # no template, or one that refuses this conversation
                raise InvalidEngineRequest(
                    f"cannot apply the chat template of {self.model.name}: {exc}"
                ) from exc
            # The template writes its own special tokens (BOS and the like).
            ids = list(self._tokenizer.encode(text, add_special_tokens=False))
        else:
            ids = list(self._tokenizer.encode(request.prompt or ""))
        if len(ids) >= self._max_model_len:
            raise InvalidEngineRequest(
                f"The prompt is {len(ids)} tokens long; {self.model.name} takes at most "
                f"{self._max_model_len - 1} prompt tokens."
            )
        return ids

    def _sampling_params(self, request: EngineRequest, prompt_tokens: int) -> Any:
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        room = self._max_model_len - prompt_tokens
        sampling = request.sampling
        max_tokens = min(sampling.max_tokens, room) if sampling.max_tokens else room
        optional: dict[str, Any] = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
        }
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                stop=list(sampling.stop) or None,
                output_kind=RequestOutputKind.DELTA,
                **{name: value for name, value in optional.items() if value is not None},
            )
        except ValueError as exc:
            raise InvalidEngineRequest(str(exc)) from exc

    async def abort(self, request_id: str) -> None:
        """Abort in vLLM; the request's stream ends with finish reason "abort"."""
        await self._llm.abort(request_id)

    async def stop(self) -> None:
        """Shut the engine and its processes down."""
        if self._llm is None:
            return
        llm, self._llm = self._llm, None
        llm.shutdown()

    def footprint(self) -> Footprint:
        """Weights on disk plus the KV cache on CPU; GPU engines report the GPU share they reserve."""
        weights = sum(f.stat().st_size for f in Path(self.model.path).glob("*.safetensors"))
        if self._device == "cpu":
            return Footprint(device="cpu", memory_bytes=weights + int(self._cpu_kvcache_gib * GIB))
        utilization = float(self.model.engine_args.get("gpu_memory_utilization", 0.9))
        return Footprint(device=self._device, memory_bytes=int(utilization * _gpu_memory_bytes()))


def _finish_reason(reason: str | None) -> Any:
    if reason is None or reason in ("stop", "length", "abort"):
        return reason
    return "stop"


def _gpu_memory_bytes() -> int:
    import torch

    return int(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else 0
