"""The GPU memory a set of processes holds, read through NVML (no CUDA context, no torch).

Engines whose GPU work runs in processes of their own (TensorRT-LLM's executor) report what those
processes hold as their footprint once they run. NVML names processes by the host's pids: in a
container without the host's pid namespace no pid matches, and the caller keeps its estimate.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger(__name__)

_nvml_lock = threading.Lock()
_nvml: Any = None  # pynvml once initialised; False where it cannot be


def processes_gpu_bytes(pids: Iterable[int]) -> int | None:
    """GPU memory held by `pids` on every GPU, or None where NVML is missing or sees none of them."""
    nvml = _initialised_nvml()
    if nvml is None:
        return None
    wanted = set(pids)
    found = False
    total = 0
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if process.pid in wanted:
                    found = True
                    total += int(process.usedGpuMemory or 0)
    except Exception:  # NVML errors are many and version-specific; an estimate is kept instead
        logger.warning("cannot read the GPU memory of processes from NVML", exc_info=True)
        return None
    return total if found else None


def _initialised_nvml() -> Any:
    global _nvml
    with _nvml_lock:
        if _nvml is None:
            _nvml = False
            with contextlib.suppress(Exception):
                import pynvml

                pynvml.nvmlInit()
                _nvml = pynvml
        return _nvml or None
