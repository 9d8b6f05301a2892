"""A real vLLM CPU engine on the demo model: what is vLLM's own (pinning, memory, the fork server).

What every engine must do (generate, abort, refuse, stop and start again, a cancelled start) is
checked against vLLM by test_engine_contract.py. Here one engine at a time, each started and stopped
inside its test (vLLM's output task belongs to the loop that drives the engine, and pytest-asyncio
gives each test its own loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from switchboard.config import ModelConfig
from switchboard.wire import SamplingParams
from workers.engines.base import EngineRequest
from workers.engines.vllm.engine import GIB, VllmEngine
from workers.engines.vllm.runtime import import_runtime
from workers.runtime.cpu_placement import available_cores

pytestmark = pytest.mark.e2e

MIB = 1024**2
# The frontend in this process keeps a little of what a start brings (tokenizer, sockets, caches).
FRONTEND_GROWTH_LIMIT = 300 * MIB


@pytest.fixture(scope="module")
def model_dir(demo_model_dir: Path) -> Path:
    return demo_model_dir


@pytest.fixture(autouse=True)
def small_kv_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """vLLM's CPU build checks NUMA node 0's free memory unless the KV cache size is given."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    yield


def demo(model_dir: Path) -> ModelConfig:
    args = {"max_model_len": 256, "dtype": "float32", "enforce_eager": True}
    return ModelConfig(name="demo", path=str(model_dir), engine_args=args)


def engine_core_cores() -> str:
    return f"{available_cores()[0]}-{available_cores()[0]}"


async def greedy_text(engine: VllmEngine, request_id: str) -> tuple[str, int]:
    sampling = SamplingParams(max_tokens=8, temperature=0.0, seed=0)
    request = EngineRequest(request_id=request_id, sampling=sampling, prompt="Tell me a story.")
    text, tokens, finish = "", 0, None
    async for delta in engine.generate(request):
        text += delta.text
        tokens = delta.completion_tokens
        finish = delta.finish_reason
    assert finish in ("length", "stop")
    return text, tokens


def tree_rss() -> int:
    """This process and everything below it (the resource tracker and the engines)."""
    total = 0
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += process.memory_info().rss
    return total


def allowed_cores(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(line.split()[1] for line in status.splitlines() if line.startswith("Cpus_allowed_list"))


def test_import_runtime_from_threads_at_once() -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            import_runtime()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_footprint_before_start_is_an_estimate(model_dir: Path) -> None:
    engine = VllmEngine(demo(model_dir), cpu_threads="0-0", cpu_kvcache_gib=1, engine_process="spawn")
    footprint = engine.footprint()
    assert footprint.device == "cpu"
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    assert footprint.memory_bytes > weights + 1 * GIB


def test_no_sleep_mode_on_cpu(model_dir: Path) -> None:
    engine = VllmEngine(demo(model_dir), cpu_threads="0-0", cpu_kvcache_gib=1, engine_process="spawn")
    assert engine.supports_sleep is False


async def test_load_and_unload_return_the_memory(model_dir: Path) -> None:
    import_runtime()
    cores = engine_core_cores()
    engine = VllmEngine(demo(model_dir), cpu_threads=cores, cpu_kvcache_gib=1, engine_process="spawn")
    rss_before_start = tree_rss()

    await engine.start()
    engine_pids = list(engine._engine_pids)
    assert engine_pids, "the engine's process is known"
    assert all(allowed_cores(pid) == cores.split("-")[0] for pid in engine_pids), "pinned to its core"
    assert engine.supports_sleep is False
    assert engine.footprint().memory_bytes > 1 * GIB  # resident: the engine with its 1 GiB KV cache
    assert (await greedy_text(engine, "a"))[1] > 0
    rss_started = tree_rss()

    await engine.stop()
    assert not [pid for pid in engine_pids if psutil.pid_exists(pid)], "no engine process is left"
    rss_stopped = tree_rss()
    assert rss_started - rss_stopped > 1 * GIB, "the engine's memory (KV cache included) is returned"
    assert rss_stopped - rss_before_start < FRONTEND_GROWTH_LIMIT


async def test_forked_engine_core(model_dir: Path) -> None:
    from workers.engines import fork_server

    fork_server.start_fork_server()
    server = fork_server.fork_server_pid()
    assert server is not None
    assert len(os.listdir(f"/proc/{server}/task")) == 1, "the fork server stays single-threaded"
    cores = engine_core_cores()
    engine = VllmEngine(demo(model_dir), cpu_threads=cores, cpu_kvcache_gib=1, engine_process="fork")

    await engine.start()
    (engine_pid,) = engine._engine_pids
    assert psutil.Process(engine_pid).ppid() == server, "forked from the fork server"
    assert allowed_cores(engine_pid) == cores.split("-")[0]
    _, tokens = await greedy_text(engine, "a")
    assert tokens > 0
    await engine.stop()

    assert not psutil.pid_exists(engine_pid)
    assert len(os.listdir(f"/proc/{server}/task")) == 1


async def test_forked_engine_core_that_dies_fails_its_running_request(model_dir: Path) -> None:
    from vllm.v1.engine.exceptions import EngineDeadError

    engine = VllmEngine(
        demo(model_dir), cpu_threads=engine_core_cores(), cpu_kvcache_gib=1, engine_process="fork"
    )
    await engine.start()
    (engine_pid,) = engine._engine_pids
    assert psutil.Process(engine_pid).name().startswith("VLLM::EngineCor"), "named like vLLM's own"
    sampling = SamplingParams(max_tokens=240, temperature=0.0, seed=0)
    request = EngineRequest(request_id="dies", sampling=sampling, prompt="Tell me a story.")
    with pytest.raises(EngineDeadError):
        async with asyncio.timeout(30):
            async for _ in engine.generate(request):
                if psutil.pid_exists(engine_pid):
                    psutil.Process(engine_pid).kill()  # the engine dies while it generates
    await engine.stop()
    assert not psutil.pid_exists(engine_pid)


def test_engines_are_not_forked_where_it_is_unverified() -> None:
    from workers.engines.vllm.forked_core import unsupported_reason

    class Gpu:
        device_type = "cuda"

        def is_cpu(self) -> bool:
            return False

    assert unsupported_reason(Gpu()) is not None


# A worker in miniature: one engine started, its EngineCore's pid printed, then nothing until killed.
KILLED_WORKER = """
import asyncio, sys
from switchboard.config import ModelConfig
from workers.engines.vllm.engine import VllmEngine
args = {"max_model_len": 256, "dtype": "float32", "enforce_eager": True}
model = ModelConfig(name="demo", path=sys.argv[1], engine_args=args)
engine = VllmEngine(model, cpu_threads=sys.argv[3], cpu_kvcache_gib=1, engine_process=sys.argv[2])
async def main():
    await engine.start()
    print("engine", *engine._engine_pids, flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""


@pytest.mark.parametrize("engine_process", ["spawn", "fork"])
def test_an_engine_process_dies_with_a_killed_worker(model_dir: Path, engine_process: str) -> None:
    import subprocess
    import sys
    import time

    worker = subprocess.Popen(
        [sys.executable, "-c", KILLED_WORKER, str(model_dir), engine_process, engine_core_cores()],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        while line and not line.startswith("engine "):  # vLLM's own lines
            line = worker.stdout.readline()
        assert line.startswith("engine "), "the engine started"
        engine_pids = [int(pid) for pid in line.split()[1:]]
        assert engine_pids and all(psutil.pid_exists(pid) for pid in engine_pids)
        worker.kill()  # SIGKILL: the worker cleans nothing up
        worker.wait()
        deadline = time.monotonic() + 30
        while any(
            psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
            for pid in engine_pids
        ):
            assert time.monotonic() < deadline, "the EngineCore outlived its worker"
            time.sleep(0.2)
    finally:
        worker.kill()


async def test_a_prompt_meets_its_cached_prefix_only_under_the_same_cache_salt(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests of one key (one salt) reuse each other's prefix blocks; another key's never do."""
    engine = VllmEngine(
        demo(model_dir), cpu_threads=engine_core_cores(), cpu_kvcache_gib=1, engine_process="spawn"
    )
    await engine.start()
    cached: dict[str, int] = {}
    generate = engine._llm.generate

    def counted(prompt: Any, params: Any, request_id: str, **kwargs: Any) -> Any:
        async def outputs() -> Any:
            async for output in generate(prompt, params, request_id, **kwargs):
                cached[request_id] = output.num_cached_tokens or 0
                yield output

        return outputs()

    # What vLLM reports of the request that reaches it: how many prompt tokens came from its cache.
    monkeypatch.setattr(engine._llm, "generate", counted)
    # About 200 tokens: a full block at least (vLLM caches whole blocks; 128 tokens on a CPU).
    prompt = "The sea was calm and the sky was grey over the harbour that morning. " * 7
    sampling = SamplingParams(max_tokens=1, temperature=0.0)
    try:
        for request_id, salt in (
            ("a1", "key-a"),
            ("a2", "key-a"),
            ("b1", "key-b"),
            ("open1", None),
            ("open2", None),
        ):
            request = EngineRequest(request_id=request_id, sampling=sampling, prompt=prompt, cache_salt=salt)
            async for _ in engine.generate(request):
                pass
    finally:
        await engine.stop()
    assert cached["a1"] == 0 and cached["a2"] > 0, cached  # the same key's second request hits
    assert cached["b1"] == 0, cached  # another key's salt: no block of key-a's prompt is reused
    assert cached["open1"] == 0 and cached["open2"] > 0, cached  # unsalted: one shared cache
