"""What kind of machine a worker runs on, and how much memory its models may take together."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

GIB = 1024**3
# Shares of the machine the models may take when no budget is configured.
GPU_SHARE = 0.9
RAM_SHARE = 0.8

_NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def machine_kind() -> str:
    """The GPU's model name (load times differ by GPU), or "cpu" on a machine without one."""
    for info in sorted(_NVIDIA_GPUS.glob("*/information")):
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                return line.partition(":")[2].strip() or "gpu"
    return "cpu"


def memory_budget_bytes(kind: str, configured_gib: float | None) -> int:
    """The configured budget, or a share of the GPU's memory, or of the RAM available now."""
    if configured_gib is not None:
        return int(configured_gib * GIB)
    if kind != "cpu":
        total = _gpu_memory_bytes()
        if total:
            return int(total * GPU_SHARE)
    return int(_available_ram_bytes() * RAM_SHARE)


def _available_ram_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def _gpu_memory_bytes() -> int:
    """Total memory of the first GPU, from nvidia-smi (the worker does not import torch to ask)."""
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return 0
    try:
        output = subprocess.run(
            [nvidia_smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits", "--id=0"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        return int(float(output.strip().splitlines()[0]) * 1024**2)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return 0
