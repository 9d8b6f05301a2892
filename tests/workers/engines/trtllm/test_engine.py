"""The TensorRT-LLM engine's own lifecycle, over the stand-in for `tensorrt_llm` (tests/support).

What every engine must do is in test_engine_contract.py; here is what is TensorRT-LLM's alone: the
arguments its `LLM` gets, load failures (refusals, build errors, no TensorRT-LLM at all) that
leave no process, the abort watchdog, what `stop()` reaps, footprints and sleep detection.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from switchboard.config import LoraConfig, ModelConfig
from switchboard.context_length import CONTEXT_LENGTH_EXCEEDED
from switchboard.wire import ChatMessage, ImageInput, SamplingParams, StructuredOutput
from tests.support import fake_tensorrt_llm as fake
from tests.support.engine_processes import descendants, engine_processes, poll_until
from workers.engines import gpu_memory
from workers.engines.base import Adapter, AdapterRefused, Delta, EngineRequest, InvalidEngineRequest
from workers.engines.registry import EngineOptions, create_engine, import_runtimes
from workers.engines.trtllm import engine as trtllm
from workers.engines.trtllm import runtime as trtllm_runtime
from workers.engines.trtllm.engine import TrtllmEngine
from workers.engines.trtllm.load_plan import RUNTIME_OVERHEAD_BYTES, UnsupportedModel

GIB = 1024**3


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Iterator[fake.Faults]:
    """The stand-in installed as `tensorrt_llm`, with short waits for aborts and exits."""
    monkeypatch.setattr(trtllm, "ABORT_GRACE_S", 0.5)
    monkeypatch.setattr(trtllm_runtime, "REAP_TIMEOUT_S", 1.0)
    yield fake.install(monkeypatch)


def demo(model_dir: Path, **fields: Any) -> ModelConfig:
    engine_args = {"max_seq_len": 256, "max_batch_size": 2, **fields.pop("engine_args", {})}
    return ModelConfig(name="demo", path=str(model_dir), engine="trtllm", engine_args=engine_args, **fields)


def engine_for(model: ModelConfig) -> TrtllmEngine:
    return TrtllmEngine(model, memory_budget_bytes=8 * GIB)


def request(request_id: str = "r", prompt: str = "Tell me a story.", **sampling: Any) -> EngineRequest:
    return EngineRequest(request_id=request_id, sampling=SamplingParams(**sampling), prompt=prompt)


async def collect(engine: TrtllmEngine, one: EngineRequest) -> list[Delta]:
    return [delta async for delta in engine.generate(one)]


async def test_the_llm_is_built_with_the_plan_and_the_prompts_tokenizer(
    faults: fake.Faults, demo_model_dir: Path
) -> None:
    engine = engine_for(demo(demo_model_dir, engine_args={"kv_cache_config": {"enable_block_reuse": False}}))
    await engine.start()
    try:
        (llm,) = fake.LLM.instances
        assert llm.tokenizer.tokenizer is engine._tokenizer  # one tokenizer for prompts and engine
        assert llm.args.kwargs["enable_chunked_prefill"] is True
        assert llm.args.kwargs["guided_decoding_backend"] == "xgrammar"
        kv_cache = llm.args.kv_cache_config
        assert isinstance(kv_cache, fake.KvCacheConfig)
        assert kv_cache.enable_block_reuse is False and kv_cache.max_gpu_total_bytes > 0
        assert engine._engine_pids == [llm._process.pid]
        assert set(engine.start_phases) == {"import", "tokenizer", "construct"}
    finally:
        await engine.stop()


async def test_a_model_it_cannot_serve_is_refused_before_anything_starts(
    faults: fake.Faults, demo_model_dir: Path
) -> None:
    engine = engine_for(demo(demo_model_dir, tool_call_parser="hermes"))
    with pytest.raises(UnsupportedModel, match="does not parse tool calls"):
        await engine.start()
    assert fake.LLM.instances == []


@pytest.mark.parametrize("leave_processes", [False, True])
async def test_a_failed_build_fails_the_load_and_leaves_no_process(
    faults: fake.Faults, demo_model_dir: Path, leave_processes: bool
) -> None:
    faults.build_error = MemoryError("CUDA out of memory")
    faults.leave_processes = leave_processes  # the executor outlives the failed build: reaped here
    before = descendants()
    with pytest.raises(RuntimeError, match="could not load demo: CUDA out of memory"):
        await engine_for(demo(demo_model_dir)).start()
    assert engine_processes(before) == []


async def test_an_argument_the_llm_refuses_fails_the_load(faults: fake.Faults, demo_model_dir: Path) -> None:
    with pytest.raises(RuntimeError, match="LLM got invalid argument: gpu_memory_utilization"):
        await engine_for(demo(demo_model_dir, engine_args={"gpu_memory_utilization": 0.5})).start()


async def test_without_tensorrt_llm_the_load_says_so_and_the_worker_goes_on(
    monkeypatch: pytest.MonkeyPatch, demo_model_dir: Path
) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # `import tensorrt_llm` fails
    import_runtimes({"trtllm"}, "spawn")  # logs, does not raise: the worker serves its other models
    with pytest.raises(RuntimeError, match="TensorRT-LLM is not installed"):
        await engine_for(demo(demo_model_dir)).start()


def test_the_registry_makes_the_engine_with_the_workers_budget(demo_model_dir: Path) -> None:
    options = EngineOptions(
        cpu_threads=None, cpu_kvcache_gib=1, engine_process="spawn", memory_budget_bytes=GIB
    )
    engine = create_engine(demo(demo_model_dir), options)
    assert isinstance(engine, TrtllmEngine) and engine._memory_budget_bytes == GIB


async def test_stop_reaps_what_the_engines_shutdown_leaves(faults: fake.Faults, demo_model_dir: Path) -> None:
    faults.leave_processes = True
    engine = engine_for(demo(demo_model_dir))
    before = descendants()
    await engine.start()
    (pid,) = engine._engine_pids
    await engine.stop()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert engine_processes(before) == []
    await engine.stop()  # idempotent


async def test_the_watchdog_ends_a_stream_the_engine_never_ends_after_an_abort(
    faults: fake.Faults, demo_model_dir: Path
) -> None:
    faults.ignore_aborts = True
    engine = engine_for(demo(demo_model_dir))
    await engine.start()
    try:
        stream = engine.generate(request(max_tokens=200, logit_bias={1: -100}))
        first = await anext(stream)
        assert first.finish_reason is None
        aborted = time.monotonic()
        await engine.abort("r")
        rest = [delta async for delta in stream]
        assert trtllm.ABORT_GRACE_S <= time.monotonic() - aborted < trtllm.ABORT_GRACE_S + 2
        assert (rest[-1].finish_reason, rest[-1].last) == ("abort", True)
        assert engine._running == {}
    finally:
        await engine.stop()


async def test_stop_ends_running_streams(faults: fake.Faults, demo_model_dir: Path) -> None:
    faults.ignore_aborts = True  # the worst case: the engine ends nothing itself
    engine = engine_for(demo(demo_model_dir))
    await engine.start()
    deltas: list[Delta] = []

    async def consume() -> None:
        async for delta in engine.generate(request(max_tokens=200, logit_bias={1: -100})):
            deltas.append(delta)

    reading = asyncio.create_task(consume())
    await poll_until(lambda: bool(deltas), 5, "a first delta")
    await engine.stop()
    await asyncio.wait_for(reading, trtllm.ABORT_GRACE_S + 2)
    assert (deltas[-1].finish_reason, deltas[-1].last) == ("abort", True)


async def test_a_consumer_that_leaves_aborts_its_request(faults: fake.Faults, demo_model_dir: Path) -> None:
    engine = engine_for(demo(demo_model_dir))
    await engine.start()
    try:
        stream = engine.generate(request(max_tokens=200, logit_bias={1: -100}))
        await anext(stream)
        (result,) = [running.result for running in engine._running.values()]
        await stream.aclose()
        assert result.aborted() and engine._running == {}
    finally:
        await engine.stop()


async def test_requests_it_cannot_serve_are_the_clients_fault(
    faults: fake.Faults, demo_model_dir: Path
) -> None:
    engine = engine_for(demo(demo_model_dir, engine_args={"guided_decoding_backend": None}))
    await engine.start()
    try:
        with pytest.raises(InvalidEngineRequest) as refused:
            await collect(engine, request(n=3, temperature=1.0, max_tokens=4))  # max_batch_size is 2
        assert refused.value.param == "n"
        with pytest.raises(InvalidEngineRequest) as refused:
            await collect(engine, request(structured=StructuredOutput(json_object=True), max_tokens=4))
        assert refused.value.param == "response_format"
    finally:
        await engine.stop()


async def test_images_are_refused_until_this_engine_takes_them(
    faults: fake.Faults, demo_model_dir: Path
) -> None:
    engine = engine_for(demo(demo_model_dir))
    await engine.start()
    try:
        image = ImageInput(media_type="image/png", data=b"png", width=1, height=1)
        message = ChatMessage(role="user", content="What is this?", parts=(0, "What is this?"))
        chat = EngineRequest(
            request_id="r", sampling=SamplingParams(max_tokens=2), messages=(message,), images=(image,)
        )
        with pytest.raises(InvalidEngineRequest) as refused:
            await collect(engine, chat)
        assert (refused.value.param, refused.value.code) == ("messages", "model_takes_no_images")
        assert "`demo`" in str(refused.value) and "TensorRT-LLM engine" in str(refused.value)
        assert (await collect(engine, request(prompt="Hi", max_tokens=2)))[-1].last
    finally:
        await engine.stop()


async def test_a_prompt_longer_than_one_step_without_chunked_prefill_is_the_clients_fault(
    faults: fake.Faults, demo_model_dir: Path
) -> None:
    # TensorRT-LLM refuses it with a RequestError, as it does its own failures: it is refused here first.
    args = {"enable_chunked_prefill": False, "max_num_tokens": 8}
    engine = engine_for(demo(demo_model_dir, engine_args=args))
    await engine.start()
    try:
        with pytest.raises(InvalidEngineRequest) as refused:
            await collect(engine, request(prompt="story " * 20, max_tokens=4))
        assert (refused.value.param, refused.value.code) == ("prompt", CONTEXT_LENGTH_EXCEEDED)
        assert (await collect(engine, request(prompt="Hi", max_tokens=2)))[-1].last
    finally:
        await engine.stop()


async def test_generating_before_start_is_an_error(faults: fake.Faults, demo_model_dir: Path) -> None:
    with pytest.raises(RuntimeError, match="not started"):
        await collect(engine_for(demo(demo_model_dir)), request())


async def test_the_footprint_is_the_plan_then_what_nvml_measures(
    faults: fake.Faults, demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engine_for(demo(demo_model_dir))
    estimate = engine.footprint()
    assert estimate.device == "cuda" and estimate.memory_bytes > RUNTIME_OVERHEAD_BYTES
    await engine.start()
    try:
        monkeypatch.setattr(gpu_memory, "_nvml", None)  # NVML absent: the estimate stands
        monkeypatch.setitem(sys.modules, "pynvml", None)
        assert engine.footprint() == estimate
        (pid,) = engine._engine_pids
        monkeypatch.setattr(gpu_memory, "_nvml", FakeNvml({pid: 3 * GIB, 1: 5 * GIB}))
        engine._measured = (0.0, None)
        assert engine.footprint().memory_bytes == 3 * GIB
    finally:
        await engine.stop()


class FakeNvml:
    """pynvml's calls the footprint makes, over one GPU running `used` (pid → bytes)."""

    def __init__(self, used: dict[int, int]) -> None:
        self._used = used

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self._used.items()]


def test_gpu_memory_of_processes_nvml_cannot_see_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_memory, "_nvml", FakeNvml({1: GIB}))
    assert gpu_memory.processes_gpu_bytes([2]) is None
    assert gpu_memory.processes_gpu_bytes([1, 2]) == GIB


class SleepyLLM(fake.LLM):
    """An `LLM` of a TensorRT-LLM with runtime memory checkpointing (newer than 1.2)."""

    def __init__(self, model: str, tokenizer: Any = None, *, sleep_config: Any = None, **kwargs: Any) -> None:
        super().__init__(model, tokenizer, **kwargs)
        self.calls: list[str] = []

    def release(self) -> None:
        self.calls.append("release")

    def resume(self) -> None:
        self.calls.append("resume")


async def test_sleep_is_found_by_feature_and_asked_for_by_the_model(
    faults: fake.Faults, demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = engine_for(demo(demo_model_dir, engine_args={"sleep_config": {}}))
    assert plain.supports_sleep is False  # 1.2's LLM has no release()
    monkeypatch.setattr(sys.modules["tensorrt_llm.llmapi"], "LLM", SleepyLLM)
    assert engine_for(demo(demo_model_dir)).supports_sleep is False  # not asked for
    engine = engine_for(demo(demo_model_dir, engine_args={"sleep_config": {}}))
    assert engine.supports_sleep is True
    await engine.start()
    try:
        assert engine.supports_sleep is True
        await engine.sleep()
        await engine.wake()
        (llm,) = fake.LLM.instances
        assert isinstance(llm, SleepyLLM) and llm.calls == ["release", "resume"]
    finally:
        await engine.stop()


async def test_an_engine_without_sleep_refuses_to_sleep(faults: fake.Faults, demo_model_dir: Path) -> None:
    engine = engine_for(demo(demo_model_dir))
    await engine.start()
    try:
        assert engine.supports_sleep is False
        with pytest.raises(NotImplementedError):
            await engine.sleep()
    finally:
        await engine.stop()


def adapter_folder(root: Path, name: str, rank: int) -> Adapter:
    """A PEFT LoRA adapter's folder as the engine checks it (its weights are not read by the stand-in)."""
    folder = root / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(f'{{"peft_type": "LORA", "r": {rank}}}')
    (folder / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    return Adapter(name=name, id=7, path=str(folder))


async def test_a_base_serves_adapters_through_its_lora_config(
    faults: fake.Faults, demo_model_dir: Path, tmp_path: Path
) -> None:
    lora = LoraConfig(max_rank=16, max_adapters=32, max_adapters_per_batch=4)
    engine = engine_for(demo(demo_model_dir, lora=lora))
    await engine.start()
    try:
        (llm,) = fake.LLM.instances
        config = llm.args.kwargs["lora_config"]
        assert isinstance(config, fake.LoraConfig)
        assert (config.lora_dir, config.max_lora_rank, config.max_loras, config.max_cpu_loras) == (
            [],
            16,
            4,
            32,
        )
        adapter = adapter_folder(tmp_path, "ft", rank=8)
        await engine.load_adapter(adapter)
        one = EngineRequest(
            request_id="a", sampling=SamplingParams(max_tokens=2), prompt="Hi", adapter=adapter
        )
        assert (await collect(engine, one))[-1].last
        assert (await collect(engine, request(max_tokens=2)))[-1].last
        first, second = llm.lora_requests
        assert (first.lora_name, first.lora_int_id, first.lora_path) == ("ft", 7, adapter.path)
        assert second is None  # the base's own request
        await engine.unload_adapter(adapter)
    finally:
        await engine.stop()


async def test_an_adapter_the_base_cannot_take_is_refused_with_what_to_change(
    faults: fake.Faults, demo_model_dir: Path, tmp_path: Path
) -> None:
    engine = engine_for(demo(demo_model_dir, lora=LoraConfig(max_rank=8)))
    plain = engine_for(demo(demo_model_dir))
    await engine.start()
    await plain.start()
    try:
        with pytest.raises(AdapterRefused, match=r"raise the base's lora\.max_rank"):
            await engine.load_adapter(adapter_folder(tmp_path, "wide", rank=64))
        with pytest.raises(AdapterRefused, match=r"no adapter_config\.json"):
            await engine.load_adapter(Adapter(name="gone", id=8, path=str(tmp_path / "gone")))
        with pytest.raises(AdapterRefused, match="does not serve LoRA adapters"):
            await plain.load_adapter(adapter_folder(tmp_path, "ft", rank=8))
    finally:
        await engine.stop()
        await plain.stop()
