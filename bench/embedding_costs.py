"""Where an embeddings level's time goes: each process's CPU per request, and Switchboard's batches.

On a machine of few cores the servers and the load generator compete for CPU, so requests/s is
bounded by the CPU each request costs, summed over the processes on its path. `CostMeter` reads the
CPU of this process and every process below it (bench/proc_cpu.py) before and after a level, by kind
of process (front door, redis-server, worker, tritonserver, Python backend stub, vLLM's server and
engine core, the load generator itself), and for a Switchboard stack the worker's own histograms of
the rows its engine computed per call and of the time a request was held in Triton's batcher.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from fair_share import worker_histogram
from proc_cpu import Snapshot, machine_cpu, snapshot

LOAD_GENERATOR = "load generator"
BATCH_ROWS = "switchboard:pooling_batch_rows"
BATCHER_WAIT = "switchboard:pooling_batcher_wait_seconds"
# vLLM's server's processes, which bench/proc_cpu.py names only by their command line.
VLLM_KINDS = {
    "other: VLLM::Worker": "vLLM model runner",
    "other: python -m vllm.entrypoints": "vLLM API server",
}


@dataclass
class LevelCosts:
    """What one level cost: CPU ms per answered request by kind of process, the machine's busy cores,
    and for Switchboard the mean rows per engine call and the mean time held in the batcher."""

    cpu_ms_per_request: dict[str, float] = field(default_factory=dict)
    busy_cores: float | None = None
    batch_rows_mean: float | None = None
    batcher_wait_ms_mean: float | None = None


class CostMeter:
    """Reads the costs before a level and again after it; `redis_url` (a Switchboard stack's) adds
    the worker's batching histograms of `model`."""

    def __init__(self, redis_url: str | None, model: str) -> None:
        self._redis_url = redis_url
        self._model = model
        self._cpu: Snapshot | None = None
        self._machine: tuple[float, float] = (0.0, 0.0)
        self._histograms: dict[str, tuple[float, float]] = {}

    def start(self) -> None:
        """Note the counters before the level."""
        self._histograms = self._read_histograms()
        self._machine = machine_cpu()
        self._cpu = snapshot(os.getpid(), LOAD_GENERATOR)

    def stop(self, answered: int, wall_s: float) -> LevelCosts:
        """The level's costs, from the counters now against those at `start`."""
        assert self._cpu is not None, "start() first"
        after = snapshot(os.getpid(), LOAD_GENERATOR)
        busy_after, _ = machine_cpu()
        costs = LevelCosts(busy_cores=round((busy_after - self._machine[0]) / wall_s, 2) if wall_s else None)
        if answered:
            by_kind = cpu_by_kind(self._cpu, after)
            costs.cpu_ms_per_request = {kind: round(s * 1000 / answered, 3) for kind, s in by_kind.items()}
        histograms = self._read_histograms()
        rows = _mean_between(self._histograms.get(BATCH_ROWS), histograms.get(BATCH_ROWS))
        wait = _mean_between(self._histograms.get(BATCHER_WAIT), histograms.get(BATCHER_WAIT))
        costs.batch_rows_mean = None if rows is None else round(rows, 2)
        costs.batcher_wait_ms_mean = None if wait is None else round(wait * 1000, 3)
        return costs

    def _read_histograms(self) -> dict[str, tuple[float, float]]:
        if self._redis_url is None:
            return {}
        return {
            name: worker_histogram(self._redis_url, name, self._model) for name in (BATCH_ROWS, BATCHER_WAIT)
        }


def cpu_by_kind(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds each kind of process spent between the snapshots (a process started meanwhile
    counts from zero), largest first."""
    spent: dict[str, float] = {}
    for pid, process in after.processes.items():
        earlier = before.processes.get(pid)
        used = process.cpu_s - (earlier.cpu_s if earlier is not None else 0.0)
        kind = short_kind(process.kind)
        spent[kind] = spent.get(kind, 0.0) + max(used, 0.0)
    return dict(sorted(spent.items(), key=lambda item: -item[1]))


def _mean_between(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    """The mean of a histogram's observations between two readings of its (sum, count)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def short_kind(kind: str) -> str:
    """A kind of process as the tables show it: vLLM's server's processes by what they do, and the
    others without the process ids some command lines hold (a guard names the pid it guards)."""
    named = next((name for prefix, name in VLLM_KINDS.items() if kind.startswith(prefix)), None)
    return named or re.sub(r"( \d+)+$", "", kind)
