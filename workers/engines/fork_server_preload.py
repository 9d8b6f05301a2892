"""Imported once by the fork server at its start (never by the worker): vLLM's engine side and the pooling runner, preloaded.

Every EngineCore forked from the fork server then starts with these modules already imported.
Nothing here may start a thread or touch CUDA: the children check both (`fork_server`).
"""

from __future__ import annotations

import contextlib
import importlib
import signal

from workers.engines.parent_death import die_with_parent
from workers.engines.process_env import set_process_defaults

# The fork server ends with its worker, however the worker ends; its engines end with it. (The
# standard library's own signal for that, end of file on a pipe, never comes while an engine it
# forked holds a copy of the pipe.)
die_with_parent(signal.SIGTERM)
set_process_defaults()
with contextlib.suppress(ImportError):
    import setproctitle

    setproctitle.setproctitle("switchboard::engine-fork-server")

# What an EngineCore, or a pooling model's process (`torch_pooling.process`), imports before it can load a
# model; a module that fails to import is left to the child, which then pays for it (the fork server
# must come up whatever happens here).
for _name in (
    "torch",
    "vllm.platforms",
    "vllm.v1.engine.core",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.model_executor.model_loader",
    "vllm.model_executor.models.llama",
    "vllm.v1.attention.backends.cpu_attn",
    "workers.engines.torch_pooling.runner",
):
    try:
        importlib.import_module(_name)
    except Exception:
        continue

# transformers' model and tokenizer classes are imported lazily, on first use: here, once.
with contextlib.suppress(Exception):
    from workers.engines.torch_pooling.runner import import_runtime

    import_runtime()
