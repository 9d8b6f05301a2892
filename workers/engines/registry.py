"""Engine names → implementations, imported only when a model needs one (engines are heavy)."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from switchboard.config import DEMO_MODEL_NAME, EngineProcess, ModelConfig
from workers.engines.base import Engine

logger = logging.getLogger(__name__)


class EngineOptions:
    """Worker-level settings an engine starts with."""

    __slots__ = ("cpu_kvcache_gib", "cpu_threads", "engine_process", "memory_budget_bytes")

    def __init__(
        self,
        *,
        cpu_threads: str | None,
        cpu_kvcache_gib: float,
        engine_process: EngineProcess,
        memory_budget_bytes: int | None = None,
    ) -> None:
        # Cores the engine computes on (CPU builds; "0-3" or "0,2"), None to leave it to the engine.
        self.cpu_threads = cpu_threads
        self.cpu_kvcache_gib = cpu_kvcache_gib
        # "fork" (from the worker's pre-imported helper) or "spawn" (a new interpreter).
        self.engine_process: EngineProcess = engine_process
        # What the worker's models may take together; None: the machine's default budget.
        self.memory_budget_bytes = memory_budget_bytes


# The package each engine needs in the worker's environment.
ENGINE_PACKAGES = {"vllm": "vllm", "trtllm": "tensorrt_llm", "torch": "transformers"}


def installed_engines() -> set[str]:
    """The engines whose package this environment holds (looked up, not imported: imports take seconds)."""
    return {engine for engine, package in ENGINE_PACKAGES.items() if importlib.util.find_spec(package)}


class NoRunnableModel(RuntimeError):
    """None of the worker's models has its engine installed here; the message says what to do."""


def runnable_models(models: list[ModelConfig]) -> list[ModelConfig]:
    """`models` less those whose engine this environment lacks (a vLLM image has no TensorRT-LLM).

    Such a model is never loaded here, so its loads cannot fail here and hold it back for the
    workers that can run it. Raises NoRunnableModel when none is left.
    """
    installed = installed_engines()
    runnable = [model for model in models if model.engine_name in installed]
    lacking = [model for model in models if model.engine_name not in installed]
    for model in lacking:
        logger.warning(
            f"{model.name} is left to other workers: its engine {model.engine_name!r} is not installed here",
            extra={"model": model.name, "engine": model.engine_name},
        )
    if not runnable and lacking:
        engines = sorted({model.engine_name for model in lacking})
        raise NoRunnableModel(
            f"this worker can run none of its models: their engines ({', '.join(engines)}) are not "
            "installed here; run it from an image that has them, or name the models it can run in "
            "worker.models"
        )
    return runnable


def import_runtimes(engines: set[str], engine_process: EngineProcess) -> None:
    """Import what starting these engines needs, once per process, so the first load skips it.

    Runs in a thread at worker start: vLLM's import alone takes several seconds, and so does the
    fork server's (in its own process), from which engines are then forked in about 2 s. A worker
    without TensorRT-LLM still serves its other models; loading a trtllm model then fails, saying why.
    """
    if "trtllm" in engines:
        from workers.engines.trtllm import import_runtime as import_trtllm

        try:
            import_trtllm()
        except RuntimeError as exc:
            logger.error("the TensorRT-LLM engine cannot start here", extra={"why": str(exc)})
    if "vllm" in engines:
        from workers.engines.vllm import import_runtime

        import_runtime()
    # Pooling models' processes are forked from the same server, which imports transformers too.
    if engine_process == "fork" and engines & {"vllm", "torch"}:
        from workers.engines.fork_server import start_fork_server

        start_fork_server()


def prepare_model_files(model: ModelConfig) -> None:
    """The demo model is built on first use; any other model must already exist. Blocking."""
    if model.name == DEMO_MODEL_NAME:
        from switchboard.local.demo_model import build_demo_model

        build_demo_model(Path(model.path), progress=lambda step: logger.info(step))


def create_engine(model: ModelConfig, options: EngineOptions) -> Engine:
    """The engine named by the model's configuration, not yet started."""
    if model.engine_name == "vllm":
        from workers.engines.vllm import VllmEngine

        return VllmEngine(
            model,
            cpu_threads=options.cpu_threads,
            cpu_kvcache_gib=options.cpu_kvcache_gib,
            engine_process=options.engine_process,
        )
    if model.engine_name == "trtllm":
        from workers.engines.trtllm import TrtllmEngine

        return TrtllmEngine(model, memory_budget_bytes=options.memory_budget_bytes)
    if model.engine_name == "torch":
        from workers.engines.torch_pooling import TorchPoolingEngine

        return TorchPoolingEngine(
            model, cpu_threads=options.cpu_threads, engine_process=options.engine_process
        )
    raise ValueError(f"model {model.name!r}: unknown engine {model.engine_name!r}")
