"""Engine processes end with the worker that started them, even when the worker is killed (Linux).

A worker killed with SIGKILL runs no cleanup: an EngineCore it started would live on, holding its
model's memory (a GPU's, for good), with nobody to serve. The kernel can signal a child when its
parent dies (`prctl(PR_SET_PDEATHSIG)`), but only the child can ask for it, so the child's entry
point does: vLLM's spawned EngineCore starts at `run_engine_core` below (see
`spawned_engines_die_with_worker`), and forked ones at `fork_server.become_engine_process`.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

from switchboard.with_parent import ask_for_signal_when_parent_dies

# Where the patched EngineCoreProc keeps vLLM's own entry point.
_ORIGINAL = "_switchboard_run_engine_core"


def die_with_parent(sig: signal.Signals) -> None:
    """Have the kernel send `sig` to this process when its parent (the thread that started it) ends.

    A refused request is ignored: the engine still serves, and the worker's descendants guard
    (`workers.runtime.descendants_guard`) still ends it after a killed worker.
    """
    with contextlib.suppress(OSError):
        ask_for_signal_when_parent_dies(sig)
    if os.getppid() == 1:  # the parent died before prctl took effect
        raise SystemExit(1)


def original_run_engine_core() -> Any:
    """vLLM's own `EngineCoreProc.run_engine_core`, whether or not `spawned_engines_die_with_worker` ran."""
    from vllm.v1.engine.core import EngineCoreProc

    return getattr(EngineCoreProc, _ORIGINAL, EngineCoreProc.run_engine_core)


def run_engine_core(*args: Any, **kwargs: Any) -> None:
    """vLLM's EngineCore process entry, in a process that dies (SIGKILL) with the worker."""
    die_with_parent(signal.SIGKILL)
    original_run_engine_core()(*args, **kwargs)


def spawned_engines_die_with_worker() -> None:
    """Start vLLM's EngineCore processes at `run_engine_core`; once per worker process, idempotent.

    vLLM hands `EngineCoreProc.run_engine_core` to the new process by name, so the process runs
    whatever that attribute is in the worker when it starts.
    """
    from vllm.v1.engine.core import EngineCoreProc

    if hasattr(EngineCoreProc, _ORIGINAL):
        return
    setattr(EngineCoreProc, _ORIGINAL, EngineCoreProc.run_engine_core)
    EngineCoreProc.run_engine_core = staticmethod(run_engine_core)  # type: ignore[method-assign,assignment]
