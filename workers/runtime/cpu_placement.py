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


def keep_off_compute_cores(cores: list[int], reserved_cores: int) -> list[int]:
    """Run this thread, and the threads and processes it starts from now on (Triton, its Python
    backend, the engine client's output handling), on the reserved cores only, so that they leave
    the compute cores to the engines (which vLLM pins there itself); the cores kept, none if every
    core computes."""
    rest = cores[len(compute_cores(cores, reserved_cores)) :]
    if rest:
        os.sched_setaffinity(0, rest)
    return rest


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


def parse_cpu_list(cpu_threads: str) -> list[int]:
    """ "0,2-3" → [0, 2, 3]: the cores named by a VLLM_CPU_OMP_THREADS_BIND-style list, in order."""
    cores: list[int] = []
    for part in cpu_threads.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError:
            raise ValueError(
                f"cannot read {cpu_threads!r} as a list of cores such as '0-3' or '0,2-3'"
            ) from None
        if first < 0 or last < first:
            raise ValueError(f"{part.strip()!r} in {cpu_threads!r} is not a range of cores")
        cores.extend(core for core in range(first, last + 1) if core not in cores)
    return cores


def omp_environment(cpu_threads: str) -> dict[str, str]:
    """The OpenMP variables that pin an engine process's compute threads to the cores of `cpu_threads`.

    One place per core, threads bound close to the master: thread i computes on the i-th core, as
    vLLM's own binding did when it still ran a separate worker process per engine. OpenMP reads
    these once, when the runtime loads, so they must be in the environment of the new process.
    """
    cores = parse_cpu_list(cpu_threads)
    return {
        "OMP_NUM_THREADS": str(len(cores)),
        "OMP_PLACES": ",".join(f"{{{core}}}" for core in cores),
        "OMP_PROC_BIND": "close",
    }
