"""vLLM imported once per worker process, before the first load needs it (imports take seconds).

The worker imports it in the background right after it starts (`registry.import_runtimes`), so a
cold load pays neither vLLM's import nor its platform probe; a load that overtakes that import
waits for it instead of importing the same modules from a second thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from workers.engines.process_env import set_process_defaults

logger = logging.getLogger(__name__)

# Imports are serialised so that the background import at worker boot and a first load that
# overtakes it never import the same modules from two threads at once.
_runtime_lock = threading.Lock()
_runtime_imported = False


def import_runtime() -> None:
    """Import what an engine start needs (vLLM, its platform, tokenizers); once per process.

    Safe from any thread. The worker calls it in the background right after it starts, so the
    first load does not pay the imports; `start()` calls it too and waits for a running import.
    """
    global _runtime_imported
    with _runtime_lock:
        if _runtime_imported:
            return
        set_process_defaults()
        started = time.monotonic()
        from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerFast  # noqa: F401
        from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: F401
        from vllm.inputs import TokensPrompt  # noqa: F401
        from vllm.platforms import current_platform
        from vllm.sampling_params import SamplingParams  # noqa: F401
        from vllm.usage.usage_lib import UsageContext  # noqa: F401
        from vllm.v1.engine.async_llm import AsyncLLM  # noqa: F401
        from vllm.v1.executor.abstract import Executor  # noqa: F401

        current_platform.is_cpu()  # resolves the platform (it probes for devices)
        _import_engine_start_modules()
        from workers.engines.parent_death import spawned_engines_die_with_worker

        spawned_engines_die_with_worker()
        _runtime_imported = True
        logger.info("engine runtime imported", extra={"seconds": round(time.monotonic() - started, 2)})


def _import_engine_start_modules() -> None:
    """Modules vLLM imports lazily while a start builds its config and front end in this process.

    Found by comparing sys.modules before and after a start; what is left is model-specific.
    """
    import importlib

    for name in (
        "vllm.v1.executor.uniproc_executor",
        "vllm.v1.engine.core_client",
        "vllm.v1.engine.utils",
        "vllm.v1.engine.core",
        "vllm.model_executor.models.registry",
        "vllm.tokenizers",
        "vllm.renderers",
        "transformers.models.auto.tokenization_auto",
        "transformers.tokenization_utils_fast",
        "vllm.renderers.hf",
        "vllm.transformers_utils.chat_templates",
        "vllm.model_executor.models.config",
        "vllm.model_executor.warmup",
        "vllm.v1.worker.block_table",
        "multiprocessing.popen_spawn_posix",
    ):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
