"""Which CPU cores each engine computes on, so Triton, the consumer and the router keep a core.

vLLM's CPU build pins its OpenMP compute threads to the cores named in VLLM_CPU_OMP_THREADS_BIND.
Left to itself it takes every core but one, for every engine: two engines would fight over the
same cores. Here the compute cores (all but `reserved_cores`) are split between the engines.
"""

from __future__ import annotations

import os


def available_cores() -> list[int]:
    """The cores this process may run on."""
    return sorted(os.sched_getaffinity(0))


def compute_cores(cores: list[int], reserved_cores: int) -> list[int]:
    """The cores left for engine compute; at least one, even on a one-core machine."""
    keep = max(1, len(cores) - reserved_cores)
    return cores[:keep]


def engine_threads_bind(cores: list[int], slot: int, slots: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND value for engine `slot` of `slots` sharing `cores`.

    Each engine gets a contiguous share; with more engines than cores, engines share a core.
    """
    if slots <= 0 or not 0 <= slot < slots:
        raise ValueError(f"slot {slot} is outside 0..{slots - 1}")
    if slots >= len(cores):
        core = cores[slot % len(cores)]
        return f"{core}-{core}"
    share = len(cores) // slots
    start = slot * share
    end = len(cores) if slot == slots - 1 else start + share
    mine = cores[start:end]
    return ",".join(_ranges(mine))


def _ranges(cores: list[int]) -> list[str]:
    """[0, 1, 2, 5] → ["0-2", "5-5"]: vLLM reads comma-separated inclusive ranges."""
    ranges: list[str] = []
    start = previous = cores[0]
    for core in cores[1:]:
        if core != previous + 1:
            ranges.append(f"{start}-{previous}")
            start = core
        previous = core
    ranges.append(f"{start}-{previous}")
    return ranges
