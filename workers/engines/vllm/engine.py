"""vLLM's AsyncLLM behind the engine interface (the GPU build, or vLLM's CPU build without a GPU).

A cold load is what a request for an unloaded model waits for, so starting is kept short:
- `import_runtime()` imports vLLM once, in the long-lived worker, before the first load;
- vLLM's caches live in a persistent folder (`VLLM_CACHE_ROOT`, ~/.cache/switchboard/vllm);
- on CPU the executor runs inside the one EngineCore process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`),
  with its OpenMP threads pinned through the environment that process is spawned with.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from switchboard import tracing
from switchboard.config import EngineProcess, LoraConfig, ModelConfig
from switchboard.wire import ModelLimits
from workers.engines.adapter_files import check_adapter_folder
from workers.engines.base import (
    Adapter,
    AdapterRefused,
    Delta,
    Engine,
    EngineRequest,
    Footprint,
    InvalidEngineRequest,
)
from workers.engines.model_files import weights_bytes
from workers.engines.phases import EnginePhases
from workers.engines.process_env import engine_process_environment, process_tree, reap, resident_bytes
from workers.engines.prompts import BuiltPrompt, PromptBuilder, builds_quickly
from workers.engines.vllm.images import image_engine_args, image_prompts
from workers.engines.vllm.io import (
    OutputReader,
    engine_prompt,
    expanded_prompt_tokens,
    refusal_of,
    vllm_sampling_params,
)
from workers.engines.vllm.runtime import import_runtime as import_runtime  # also imported from here
from workers.engines.vllm.tools import ToolCallExtractor, tool_parser_class
from workers.runtime.cpu_placement import omp_environment

logger = logging.getLogger(__name__)

GIB = 1024**3
# What one engine process costs on CPU beyond its weights and KV cache: the interpreter with
# torch and vLLM imported and the model runner's buffers. Measured on the demo model with one
# EngineCore process (VLLM_ENABLE_V1_MULTIPROCESSING=0): 1,673 MiB resident = 5 MiB of weights +
# 1 GiB of KV cache + 0.63 GiB; rounded up, as an estimate for placement should be.
CPU_PROCESS_OVERHEAD_BYTES = int(0.7 * GIB)
# How long stop() waits for the engine's processes to exit after vLLM's shutdown before killing them.
REAP_TIMEOUT_S = 10.0
# How long a reading of the engine processes' resident memory stands.
RESIDENT_REFRESH_S = 5.0


def _platform() -> Any:
    import_runtime()
    from vllm.platforms import current_platform

    return current_platform


class VllmEngine(Engine):
    """One model in one vLLM AsyncLLM, whose EngineCore runs in a process of its own.

    `engine_process` says how that process starts: "spawn" (vLLM's own way: a new interpreter that
    imports vLLM) or "fork" (forked from the worker's fork server, see `forked_core`).
    """

    def __init__(
        self,
        model: ModelConfig,
        *,
        cpu_threads: str | None,
        cpu_kvcache_gib: float,
        engine_process: EngineProcess,
    ) -> None:
        super().__init__(model)
        self._engine_process = engine_process
        self._forked: Any = None
        # Cores this engine computes on (CPU builds), as "0-3" or "0,2-3"; None leaves it to OpenMP.
        self._cpu_threads = cpu_threads
        self._cpu_kvcache_gib = cpu_kvcache_gib
        self._llm: Any = None
        self._engine_pids: list[int] = []
        self._resident: tuple[float, int] = (0.0, 0)  # (monotonic time read, bytes)
        self._tokenizer: Any = None
        self._prompts: PromptBuilder | None = None
        self._sleep_enabled = False
        self.start_seconds = 0.0
        self.stop_seconds = 0.0

    # --- start and stop ---------------------------------------------------------------------

    async def start(self) -> None:
        """Build the AsyncLLM off the event loop, then warm its tokenizer."""
        if self._llm is not None:
            raise RuntimeError(f"the engine of {self.model.name} is already started")
        started = time.monotonic()
        build = asyncio.ensure_future(asyncio.to_thread(self._build))
        try:
            self._llm = await asyncio.shield(build)
        except asyncio.CancelledError:
            # The thread cannot be interrupted: once it has built the engine, shut that down, so
            # that no engine process outlives a cancelled start.
            build.add_done_callback(self._discard_build)
            raise
        self._engine_pids = [self._forked.pid] if self._forked is not None else _core_pids(self._llm)
        self._tokenizer = self._llm.get_tokenizer()
        if self.model.tool_call_parser is not None:
            tool_parser_class(self.model.tool_call_parser)  # a typo fails the load, not each request
        # A vision model's settings run its processor on a few images: off the loop.
        images = await asyncio.to_thread(image_prompts, self._llm, self._tokenizer, self.model)
        self._prompts = PromptBuilder(
            self._tokenizer,
            model_name=self.model.name,
            max_model_len=self._llm.model_config.max_model_len,
            vocab_size=self._llm.model_config.get_vocab_size(),
            chat_template=images.chat_template,
            content_parts=images.content_parts,
            min_image_tokens=images.min_image_tokens,
        )
        self._sleep_enabled = bool(self._llm.vllm_config.model_config.enable_sleep_mode)
        self.start_seconds = time.monotonic() - started
        logger.info(
            "engine started",
            extra={
                "model": self.model.name,
                "seconds": round(self.start_seconds, 2),
                "device": self.footprint().device,
                "engine_pids": self._engine_pids,
            },
        )

    def _discard_build(self, build: asyncio.Future[Any]) -> None:
        if build.cancelled() or build.exception() is not None:
            return
        llm, forked, self._forked = build.result(), self._forked, None
        shutdown = forked.shutdown if forked is not None else llm.shutdown
        threading.Thread(target=shutdown, name="DiscardCancelledEngine", daemon=True).start()
        logger.warning("engine start cancelled; shutting the engine down", extra={"model": self.model.name})

    def _build(self) -> Any:
        platform = _platform()
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(**self._engine_kwargs(platform))
        # Outside the spawn lock: reading the model's config and tokenizer needs no process.
        vllm_config = args.create_engine_config(UsageContext.ENGINE_CONTEXT)
        if self._engine_process == "fork" and self._can_fork(platform):
            from workers.engines.vllm import forked_core

            self._forked = forked_core.launch(
                vllm_config,
                cpu_threads=self._cpu_threads if platform.is_cpu() else None,
                log_stats=not args.disable_log_stats,
                log_requests=args.enable_log_requests,
            )
            return self._forked.llm
        with engine_process_environment(self._spawn_environment(platform), locked=platform.is_cpu()):
            return AsyncLLM.from_vllm_config(
                vllm_config,
                enable_log_requests=args.enable_log_requests,
                disable_log_stats=args.disable_log_stats,
            )

    def _can_fork(self, platform: Any) -> bool:
        from workers.engines.vllm import forked_core

        reason = forked_core.unsupported_reason(platform)
        if reason is not None:
            logger.warning(
                "cannot fork the engine; spawning it", extra={"model": self.model.name, "why": reason}
            )
        return reason is None

    def _engine_kwargs(self, platform: Any) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": self.model.path, **self.model.engine_args}
        kwargs["structured_outputs_config"] = _structured_outputs_config(
            kwargs.get("structured_outputs_config")
        )
        if self.model.lora is not None:
            kwargs.update(_lora_kwargs(self.model.lora, kwargs))
        kwargs.update(image_engine_args(self.model, kwargs))
        if platform.is_cpu():
            # vLLM's CPU build sizes its KV cache from NUMA node 0 (which can be far smaller than
            # the machine) and refuses to start unless most of it is free; a fixed size per
            # engine starts reliably. VLLM_CPU_KVCACHE_SPACE, where set, still overrides it.
            kwargs.setdefault("kv_cache_memory_bytes", int(self._cpu_kvcache_gib * GIB))
        elif platform.is_sleep_mode_available():
            kwargs.setdefault("enable_sleep_mode", True)
        return kwargs

    def _spawn_environment(self, platform: Any) -> dict[str, str]:
        if not platform.is_cpu() or self._cpu_threads is None:
            return {}
        return omp_environment(self._cpu_threads)

    async def stop(self) -> None:
        """Shut the engine down; returns when its processes have exited and their memory is free."""
        if self._llm is None:
            return
        llm, self._llm = self._llm, None
        started = time.monotonic()
        processes = process_tree(self._engine_pids)
        # The output task reads from the engine: end it first, or it reports the engine's exit as
        # a failure. vLLM started it on this loop (the one that drives the engine).
        handler = getattr(llm, "output_handler", None)
        if handler is not None and handler.get_loop() is asyncio.get_running_loop():
            handler.cancel()
        # vLLM's shutdown joins the engine process (seconds): off the loop, so other models'
        # streams keep flowing. It hands the closing of its sockets back to their loop itself.
        if self._forked is not None:
            forked, self._forked = self._forked, None
            await asyncio.to_thread(forked.shutdown, REAP_TIMEOUT_S)
        else:
            await asyncio.to_thread(llm.shutdown)
        survivors = await asyncio.to_thread(reap, processes, REAP_TIMEOUT_S)
        if survivors:
            logger.warning("engine processes killed after shutdown", extra={"pids": survivors})
        self._engine_pids = []
        self._tokenizer = None
        self._prompts = None
        del llm
        gc.collect()
        self.stop_seconds = time.monotonic() - started
        logger.info(
            "engine stopped", extra={"model": self.model.name, "seconds": round(self.stop_seconds, 2)}
        )

    # --- sleep --------------------------------------------------------------------------------

    @property
    def supports_sleep(self) -> bool:
        """vLLM sleep mode: GPU builds only (vLLM's CPU build refuses `enable_sleep_mode`).

        Before `start`, this needs vLLM's platform, like `footprint`.
        """
        if self._llm is not None:
            return self._sleep_enabled
        return bool(self.model.engine_args.get("enable_sleep_mode", True)) and bool(
            _platform().is_sleep_mode_available()
        )

    async def sleep(self) -> None:
        """Level 1: weights offloaded to host memory, KV cache discarded; running requests are aborted."""
        if not self._sleep_enabled:
            await super().sleep()
        await self._llm.sleep(level=1)

    async def wake(self) -> None:
        """Bring the weights back and reallocate the KV cache."""
        if not self._sleep_enabled:
            await super().wake()
        await self._llm.wake_up()

    # --- what it occupies -----------------------------------------------------------------------

    def footprint(self) -> Footprint:
        """Started on CPU: the engine processes' resident memory. Otherwise what a start reserves.

        Needs vLLM's platform: before `import_runtime` has run, this imports vLLM (seconds), so
        call it off the event loop then.
        """
        platform = _platform()
        if not platform.is_cpu():
            device = str(platform.device_type)
            utilization = float(self.model.engine_args.get("gpu_memory_utilization", 0.9))
            return Footprint(
                device=device, memory_bytes=int(utilization * platform.get_device_total_memory())
            )
        if self._engine_pids:
            resident = self._resident_bytes()
            if resident:
                return Footprint(device="cpu", memory_bytes=resident)
        return Footprint(device="cpu", memory_bytes=self._cpu_estimate_bytes())

    def _resident_bytes(self) -> int:
        """The engine processes' resident memory, read at most every RESIDENT_REFRESH_S: reading it
        walks every process of the machine, and the controller asks on every pass."""
        now = time.monotonic()
        read_at, resident = self._resident
        if now - read_at >= RESIDENT_REFRESH_S or not resident:
            resident = resident_bytes(self._engine_pids)
            self._resident = (now, resident)
        return resident

    def _cpu_estimate_bytes(self) -> int:
        kv_cache = self.model.engine_args.get("kv_cache_memory_bytes") or int(self._cpu_kvcache_gib * GIB)
        return weights_bytes(Path(self.model.path)) + int(kv_cache) + CPU_PROCESS_OVERHEAD_BYTES

    # --- generation -----------------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[Delta]:
        """Stream deltas; a long prompt is built (template, tokenizer, images) off the event loop."""
        builder = self._prompts
        if builder is None:
            raise RuntimeError(f"the engine of {self.model.name} is not started")
        # Tokenizing a long prompt or decoding images takes a while: never on the loop that drives
        # every other stream.
        with tracing.span("switchboard.prompt_build"):
            if builds_quickly(request):
                prompt, inputs = _inputs(builder, request)
            else:
                prompt, inputs = await asyncio.to_thread(_inputs, builder, request)
        prompt_param = "messages" if request.messages is not None else "prompt"
        tools = self._tool_call_extractor(request)
        params = vllm_sampling_params(
            request.sampling,
            prompt,
            builder,
            prompt_param=prompt_param,
            skip_special_tokens=tools.skip_special_tokens if tools is not None else True,
            output_every=request.output_every,
        )
        reader = OutputReader(request.sampling, prompt, self._tokenizer)
        phases = EnginePhases(len(prompt.token_ids)) if tracing.enabled() else None
        stream = self._llm.generate(
            inputs,
            params,
            request.request_id,
            lora_request=_lora_request(request.adapter),
        )
        before_output = True
        try:
            async for output in stream:
                if before_output and prompt.images:
                    await self._refuse_expanded_too_long(
                        request, builder, expanded_prompt_tokens(output, prompt)
                    )
                before_output = False
                if phases is not None:
                    phases.output()
                for delta in reader.deltas(output):
                    held = tools.hold(delta) if tools is not None else delta
                    if held is not None:
                        yield held
        except Exception as exc:
            # vLLM's own validation (a grammar it cannot compile, a schema nested too deeply) is the
            # client's error, answered with a 400 like the checks above; the rest is the engine's.
            refusal = refusal_of(exc, before_output=before_output, prompt_param=prompt_param)
            if refusal is None:
                raise
            raise refusal from exc
        finally:
            if phases is not None:
                phases.end()

    async def _refuse_expanded_too_long(
        self, request: EngineRequest, builder: PromptBuilder, prompt_tokens: int
    ) -> None:
        """Refuse `max_tokens` that do not fit after the prompt as vLLM expanded its images (which
        only vLLM counts), as every other prompt's are refused: vLLM would cut the answer short."""
        max_tokens = request.sampling.max_tokens
        if max_tokens is None:
            return
        try:
            builder.refuse_completion_too_long(prompt_tokens, max_tokens, "messages")
        except InvalidEngineRequest:
            await self._llm.abort(request.request_id)
            raise

    def _tool_call_extractor(self, request: EngineRequest) -> ToolCallExtractor | None:
        parser = self.model.tool_call_parser
        if not request.parse_tool_calls or parser is None:
            return None
        return ToolCallExtractor(parser, self._tokenizer, request)

    def limits(self) -> ModelLimits | None:
        """The started model's context length, vocabulary size and longest token."""
        return self._prompts.limits if self._prompts is not None else None

    def ended(self) -> str | None:
        """Why the EngineCore can no longer generate, once vLLM's front end knows it died."""
        llm = self._llm
        if llm is None or not llm.errored:
            return None
        return f"the vLLM engine core process of {self.model.name} ended (killed, out of memory, or crashed)"

    def process_ids(self) -> list[int]:
        """The EngineCore processes."""
        return list(self._engine_pids)

    def max_sequences(self) -> int | None:
        """The scheduler's `max_num_seqs` (the engine's default for its platform unless configured)."""
        return int(self._llm.vllm_config.scheduler_config.max_num_seqs) if self._llm is not None else None

    # --- adapters -------------------------------------------------------------------------------

    async def load_adapter(self, adapter: Adapter) -> None:
        """Into the engine's adapter cache (`max_cpu_loras`, which the controller never overfills)."""
        lora = self.model.lora
        if lora is None or self._llm is None:
            await super().load_adapter(adapter)
            return
        check_adapter_folder(adapter, max_rank=int(self._llm.vllm_config.lora_config.max_lora_rank))
        try:
            added = await self._llm.add_lora(_lora_request(adapter))
        except Exception as exc:
            raise AdapterRefused(f"the engine could not load adapter {adapter.name}: {exc}") from exc
        if not added:
            raise AdapterRefused(f"the engine refused adapter {adapter.name}")

    async def unload_adapter(self, adapter: Adapter) -> None:
        """Out of the engine's adapter cache; its memory is free for the next."""
        if self._llm is not None:
            await self._llm.remove_lora(adapter.id)

    async def abort(self, request_id: str) -> None:
        """Abort in vLLM; the request's stream ends with finish reason "abort"."""
        await self._llm.abort(request_id)


def _inputs(builder: PromptBuilder, request: EngineRequest) -> tuple[BuiltPrompt, Any]:
    """The request's prompt, and vLLM's input of it (its images decoded)."""
    prompt = builder.build(request)
    return prompt, engine_prompt(prompt, request.cache_salt)


def _lora_kwargs(lora: LoraConfig, configured: dict[str, Any]) -> dict[str, Any]:
    """vLLM's LoRA arguments from the base's `lora` table (its own engine_args win)."""
    defaults = {
        "enable_lora": True,
        "max_lora_rank": lora.max_rank,
        "max_cpu_loras": lora.max_adapters,
        "max_loras": min(lora.max_adapters_per_batch, lora.max_adapters),
    }
    return {name: configured.get(name, value) for name, value in defaults.items()}


def _lora_request(adapter: Adapter | None) -> Any:
    if adapter is None:
        return None
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=adapter.name, lora_int_id=adapter.id, lora_path=adapter.path)


def _structured_outputs_config(configured: dict[str, Any] | None) -> Any:
    """vLLM's structured output settings: the model's own, over compact JSON by default.

    Whitespace between JSON tokens carries nothing, and a model may emit it until max_tokens runs
    out; without it, an answer under `response_format` or a forced tool call always ends. vLLM
    allows that only with a named backend: xgrammar, its default, which reads every tokenizer.
    """
    from vllm.config import StructuredOutputsConfig

    defaults = {"backend": "xgrammar", "disable_any_whitespace": True}
    return StructuredOutputsConfig(**{**defaults, **(configured or {})})


def _core_pids(llm: Any) -> list[int]:
    """The EngineCore processes vLLM started for `llm` (vLLM's process manager keeps them)."""
    manager = getattr(getattr(getattr(llm, "engine_core", None), "resources", None), "engine_manager", None)
    return [proc.pid for proc in getattr(manager, "processes", []) if proc.pid is not None]
