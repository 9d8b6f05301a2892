"""TensorRT-LLM's LLM API (1.x, PyTorch backend: no engine build) behind the engine interface.

The `LLM` object lives in the worker as a front end, like vLLM's AsyncLLM; TensorRT-LLM runs the
model in an executor process it starts itself (through MPI), which `stop()` reaps with everything
else the build started (`runtime`). Requests are submitted on the event loop's thread
(TensorRT-LLM binds a result's queue to the loop it was made on) and their outputs read by
`io.TrtOutputReader`. An aborted request whose final output does not come within
ABORT_GRACE_S is ended here (TensorRT-LLM's cancellation has had bugs that left results hanging).
What TensorRT-LLM refuses of a request itself (its arguments' checks as it is made and submitted, a
guide its grammar backend cannot compile) is the client's error, quoted as vLLM's refusals are
(`refusals`); its other failures stay the engine's.

Footprint: before the first load, `load_plan.LoadPlan.footprint_bytes`: the weights' files,
plus the KV cache's ceiling, plus RUNTIME_OVERHEAD_BYTES (the executor's CUDA context,
activations, CUDA graphs). The ceiling is what the model's `kv_cache_config` bounds it to
(`max_gpu_total_bytes`, or `max_tokens` times the bytes of one token's keys and values), else
DEFAULT_KV_CACHE_SHARE of the worker's memory budget, passed to TensorRT-LLM as
`max_gpu_total_bytes` so that its own `free_gpu_memory_fraction` (a share of whatever happens to be
free at load) never decides alone. Once started, what NVML reports for the engine's processes
(where it can see them; the estimate otherwise). The worker's own CUDA context (TensorRT-LLM's
front end makes one, once per process) is left to the budget's headroom.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from switchboard import tracing
from switchboard.config import ModelConfig
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
from workers.engines.gpu_memory import processes_gpu_bytes
from workers.engines.phases import EnginePhases
from workers.engines.process_env import process_tree
from workers.engines.prompts import BuiltPrompt, PromptBuilder, builds_quickly
from workers.engines.trtllm.io import (
    TrtOutputReader,
    TrtSampling,
    trtllm_sampling,
)
from workers.engines.trtllm.load_plan import LoadPlan, UnsupportedModel, plan_load, refusal
from workers.engines.trtllm.refusals import (
    check_no_images,
    check_one_step_holds,
    stream_refusal,
    submit_refusal,
)
from workers.engines.trtllm.runtime import (
    LORA_REQUEST_MODULE,
    Built,
    build,
    can_release,
    embedding_bias,
    import_runtime,
    imported_llm_class,
    machine_budget_bytes,
    shut_down,
)

logger = logging.getLogger(__name__)

# After an abort, how long the engine may take to end the request before its stream is ended here.
ABORT_GRACE_S = 5.0
# How long a reading of the engine processes' GPU memory stands.
MEASURED_REFRESH_S = 5.0
# What an exhausted output iterator returns.
_END = object()


class _Running:
    """One request in the engine: its result, and the abort watchdog's state."""

    __slots__ = ("aborted", "expired", "iterator", "result", "step", "watchdog")

    def __init__(self, result: Any) -> None:
        self.result = result
        self.iterator = result.__aiter__()
        self.step: asyncio.Future[Any] | None = None
        self.watchdog: asyncio.TimerHandle | None = None
        self.aborted = False
        self.expired = False

    def close(self) -> None:
        """The stream ended: stop the watchdog, and abort the request if the engine still runs it."""
        if self.watchdog is not None:
            self.watchdog.cancel()
        if not self.result.finished and not self.aborted:
            self.aborted = True
            with contextlib.suppress(Exception):  # an engine shutting down refuses aborts too
                self.result.abort()


class TrtllmEngine(Engine):
    """One model in one TensorRT-LLM `LLM` (PyTorch backend), its executor in a process of its own."""

    def __init__(self, model: ModelConfig, *, memory_budget_bytes: int | None = None) -> None:
        super().__init__(model)
        # The worker's budget (the default KV cache is a share of it); None: the machine's default.
        self._memory_budget_bytes = memory_budget_bytes
        self._plan: LoadPlan | None = None
        self._llm: Any = None
        self._runtime: Any = None  # the tensorrt_llm.llmapi module, once started
        self._tokenizer: Any = None
        self._prompts: PromptBuilder | None = None
        self._engine_pids: list[int] = []
        self._running: dict[str, _Running] = {}
        self._measured: tuple[float, int | None] = (0.0, None)  # (monotonic time read, bytes)
        self._sleep_enabled = False
        self.start_seconds = 0.0
        self.stop_seconds = 0.0
        # Seconds of each part of the last start: import, tokenizer, construct.
        self.start_phases: dict[str, float] = {}

    # --- start and stop ---------------------------------------------------------------------

    async def start(self) -> None:
        """Build the `LLM` off the event loop; what it cannot serve is refused before any GPU work."""
        if self._llm is not None:
            raise RuntimeError(f"the engine of {self.model.name} is already started")
        reason = refusal(self.model)
        if reason is not None:
            raise UnsupportedModel(reason)
        started = time.monotonic()
        building = asyncio.ensure_future(asyncio.to_thread(self._build))
        try:
            built = await asyncio.shield(building)
        except asyncio.CancelledError:
            # The thread cannot be interrupted: once it has built the engine, shut that down, so
            # that no engine process outlives a cancelled start.
            building.add_done_callback(self._discard_build)
            raise
        self._llm, self._tokenizer, self._prompts = built.llm, built.tokenizer, built.prompts
        self._runtime = import_runtime()  # imported by the build: at once
        self._engine_pids = built.pids
        self.start_phases = built.phases
        self._sleep_enabled = "sleep_config" in self.model.engine_args and can_release(built.llm)
        self.start_seconds = time.monotonic() - started
        args = getattr(built.llm, "args", None)
        logger.info(
            "engine started",
            extra={
                "model": self.model.name,
                "seconds": round(self.start_seconds, 2),
                "phases": self.start_phases,
                "engine_pids": self._engine_pids,
                **{
                    name: getattr(args, name, None)
                    for name in ("max_seq_len", "max_batch_size", "max_num_tokens")
                },
            },
        )

    def _build(self) -> Built:
        return build(self.model, self._load_plan())

    def _discard_build(self, building: asyncio.Future[Built]) -> None:
        if building.cancelled() or building.exception() is not None:
            return
        built = building.result()
        threading.Thread(
            target=shut_down, args=(built.llm, built.pids), name="DiscardCancelledEngine", daemon=True
        ).start()
        logger.warning("engine start cancelled; shutting the engine down", extra={"model": self.model.name})

    async def stop(self) -> None:
        """Shut the engine down; returns when every process it started has exited. Idempotent."""
        if self._llm is None:
            return
        llm, self._llm = self._llm, None
        started = time.monotonic()
        for request_id in list(self._running):
            await self.abort(request_id)  # each stream ends within ABORT_GRACE_S
        # TensorRT-LLM's shutdown joins its executor (seconds): off the loop, so other models'
        # streams keep flowing.
        await asyncio.to_thread(shut_down, llm, self._engine_pids)
        self._engine_pids = []
        self._tokenizer = None
        self._prompts = None
        self._measured = (0.0, None)
        del llm
        gc.collect()
        self.stop_seconds = time.monotonic() - started
        logger.info(
            "engine stopped", extra={"model": self.model.name, "seconds": round(self.stop_seconds, 2)}
        )

    # --- sleep --------------------------------------------------------------------------------

    @property
    def supports_sleep(self) -> bool:
        """Where TensorRT-LLM can release its GPU memory (`LLM.release`/`resume`, newer than 1.2)
        and the model opts in (`engine_args.sleep_config`). Before `start`, only if the runtime is
        imported already (this never imports it)."""
        if self._llm is not None:
            return self._sleep_enabled
        return "sleep_config" in self.model.engine_args and can_release(imported_llm_class())

    async def sleep(self) -> None:
        """Release the GPU memory TensorRT-LLM tags (weights kept in host memory, KV cache dropped)."""
        if not self._sleep_enabled:
            await super().sleep()
        for request_id in list(self._running):
            await self.abort(request_id)
        await asyncio.to_thread(self._llm.release)

    async def wake(self) -> None:
        """Map the released memory again and restore the weights."""
        if not self._sleep_enabled:
            await super().wake()
        await asyncio.to_thread(self._llm.resume)

    # --- what it occupies -----------------------------------------------------------------------

    def footprint(self) -> Footprint:
        """Started: the GPU memory of the engine's processes (NVML). Otherwise, or where NVML cannot
        see them, the plan's estimate (see the module's docstring). Reads files: call it off the
        event loop before the engine has started."""
        if self._engine_pids:
            measured = self._measured_bytes()
            if measured:
                return Footprint(device="cuda", memory_bytes=measured)
        return Footprint(device="cuda", memory_bytes=self._load_plan().footprint_bytes)

    def _measured_bytes(self) -> int | None:
        now = time.monotonic()
        read_at, measured = self._measured
        if now - read_at >= MEASURED_REFRESH_S or measured is None:
            measured = processes_gpu_bytes(p.pid for p in process_tree(self._engine_pids))
            self._measured = (now, measured)
        return measured

    def _load_plan(self) -> LoadPlan:
        if self._plan is None:
            budget = self._memory_budget_bytes
            self._plan = plan_load(self.model, budget if budget is not None else machine_budget_bytes())
        return self._plan

    def process_ids(self) -> list[int]:
        """The executor's processes."""
        return list(self._engine_pids)

    def max_sequences(self) -> int | None:
        """The executor's `max_batch_size`."""
        return self._plan.max_batch_size if self._plan is not None else None

    def limits(self) -> ModelLimits | None:
        """The started model's context length (`max_seq_len`), vocabulary size and longest token."""
        return self._prompts.limits if self._prompts is not None else None

    # --- generation -----------------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[Delta]:
        """Stream deltas; a long prompt is built off the event loop, the request submitted on it."""
        llm, builder = self._llm, self._prompts
        if llm is None or builder is None:
            raise RuntimeError(f"the engine of {self.model.name} is not started")
        check_no_images(self.model.name, request)
        with tracing.span("switchboard.prompt_build"):
            if builds_quickly(request):
                prompt = builder.build(request)
            else:
                prompt = await asyncio.to_thread(builder.build, request)
        prompt_param = "messages" if request.messages is not None else "prompt"
        sampling = trtllm_sampling(request.sampling, prompt, builder, prompt_param=prompt_param)
        check_one_step_holds(llm, prompt, prompt_param)
        reader = TrtOutputReader(request.sampling, prompt, self._tokenizer, max_tokens=sampling.max_tokens)
        running = _Running(self._submitted(llm, prompt, sampling, self._lora_request(request.adapter)))
        phases = EnginePhases(len(prompt.token_ids)) if tracing.enabled() else None
        self._running[request.request_id] = running
        try:
            before_output = True
            while not reader.ended:
                output = await self._next_output_of(running, before_output=before_output)
                if output is None or output is _END:
                    if output is None:
                        logger.warning(
                            "no final output after an abort; the stream is ended here",
                            extra={"model": self.model.name, "request_id": request.request_id},
                        )
                    for delta in reader.cut_off():
                        yield delta
                    break
                before_output = False
                if phases is not None:
                    phases.output()
                for delta in reader.deltas(output):
                    yield delta
        finally:
            if self._running.get(request.request_id) is running:
                del self._running[request.request_id]
            running.close()
            if phases is not None:
                phases.end()

    async def _next_output_of(self, running: _Running, *, before_output: bool) -> Any:
        """As `_next_output`; the engine's refusal of the request, before any output, is the client's
        error (see `refusals.stream_refusal`)."""
        try:
            return await self._next_output(running)
        except Exception as exc:
            refused = stream_refusal(
                exc, before_output=before_output, request_error=self._runtime.RequestError
            )
            if refused is None:
                raise
            raise refused from exc

    def _submitted(self, llm: Any, prompt: BuiltPrompt, sampling: TrtSampling, lora: Any = None) -> Any:
        """The request's result; what TensorRT-LLM refuses of its arguments is the client's error."""
        try:
            return self._submit(llm, prompt, self._sampling_params(sampling), lora)
        except InvalidEngineRequest:
            raise
        except Exception as exc:
            refused = submit_refusal(exc)
            if refused is None:
                raise
            raise refused from exc

    def _sampling_params(self, sampling: TrtSampling) -> Any:
        """TensorRT-LLM's SamplingParams for `sampling`, with its guide and embedding bias."""
        runtime, plan = self._runtime, self._load_plan()
        kwargs = dict(sampling.kwargs)
        if kwargs["n"] > plan.max_batch_size:
            raise InvalidEngineRequest(
                f"n must be at most {plan.max_batch_size} for this model (its max_batch_size).",
                param="n",
                code="invalid_value",
            )
        if sampling.guide is not None:
            if not plan.structured_output:
                raise InvalidEngineRequest(
                    f"{self.model.name} has no structured output (its guided_decoding_backend is unset).",
                    param="response_format",
                )
            kwargs["guided_decoding"] = runtime.GuidedDecodingParams(**sampling.guide)
        if sampling.logit_bias:
            kwargs["embedding_bias"] = embedding_bias(sampling.logit_bias, plan.vocab_size)
        # Its own checks run here, and raise ValueError: see `_submitted`.
        return runtime.SamplingParams(**kwargs)

    @staticmethod
    def _submit(llm: Any, prompt: BuiltPrompt, params: Any, lora: Any = None) -> Any:
        """Hand the request to the engine; on the loop's thread, where its result's queue belongs."""
        return llm.generate_async(
            {"prompt_token_ids": prompt.token_ids}, sampling_params=params, lora_request=lora, streaming=True
        )

    # --- adapters -------------------------------------------------------------------------------

    async def load_adapter(self, adapter: Adapter) -> None:
        """Check the adapter's folder; TensorRT-LLM reads it into its adapter cache with the first
        request that names it (its `max_cpu_loras` is `lora.max_adapters`, which the controller never
        overfills, so the engine evicts no adapter the controller holds)."""
        lora = self.model.lora
        if lora is None or self._llm is None:
            await super().load_adapter(adapter)
            return
        max_rank = int(self._load_plan().kwargs["lora_config"]["max_lora_rank"])
        check_adapter_folder(adapter, max_rank=max_rank)
        self._lora_request(adapter)  # the runtime's own check of the request, now rather than per job

    async def unload_adapter(self, adapter: Adapter) -> None:
        """Nothing to call: TensorRT-LLM's LLM API has no removal; the adapter, asked for no more,
        leaves its cache when another needs the room."""
        if self.model.lora is None:
            await super().unload_adapter(adapter)

    def _lora_request(self, adapter: Adapter | None) -> Any:
        if adapter is None:
            return None
        lora_requests = importlib.import_module(LORA_REQUEST_MODULE)
        try:
            return lora_requests.LoRARequest(adapter.name, adapter.id, adapter.path)
        except ValueError as exc:
            raise AdapterRefused(f"TensorRT-LLM refused adapter {adapter.name}: {exc}") from exc

    @staticmethod
    async def _next_output(running: _Running) -> Any:
        """The request's next output; _END when there is none; None when the watchdog gave up."""
        if running.expired:
            return None
        running.step = asyncio.ensure_future(_next(running.iterator))
        try:
            return await running.step
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if running.expired and task is not None and task.cancelling() == 0:
                return None
            raise
        finally:
            running.step = None

    async def abort(self, request_id: str) -> None:
        """Abort in TensorRT-LLM; the stream ends with "abort" when its cancelled output arrives, or
        ABORT_GRACE_S later without it. An unknown request is a no-op."""
        running = self._running.get(request_id)
        if running is None or running.aborted:
            return
        running.aborted = True
        try:
            running.result.abort()
        except Exception:
            logger.warning("the engine refused an abort", exc_info=True, extra={"request_id": request_id})
        running.watchdog = asyncio.get_running_loop().call_later(ABORT_GRACE_S, _give_up, running)


async def _next(iterator: Any) -> Any:
    try:
        return await iterator.__anext__()
    except StopAsyncIteration:
        return _END


def _give_up(running: _Running) -> None:
    """The abort's grace period is over: end the stream without the engine's final output."""
    if running.result.finished:
        return
    running.expired = True
    if running.step is not None:
        running.step.cancel()
