"""CPU a level of load cost each process and thread group, less what they spend with no load at all.

Between two snapshots each thread's CPU grows by some seconds (and its runs, and its wait for a core).
A process's own counter also holds its threads that ended in between: where threads came or went,
the counter's growth less its live threads' is shown as a group of its own. That counter is in whole
clock ticks (10 ms), so where no thread came or went the difference is rounding and is left out.
The idle baseline is the same reading over a stretch with no requests: each thread's idle rate times
the level's wall time is background work (polling, timers) that would have happened anyway, and is
not charged to the requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from proc_cpu import Snapshot, Thread, thread_group

ENDED_TID = -1  # the pseudo-thread that stands for a process's threads that ended
ENDED_THREADS = "(threads that ended)"

ThreadKey = tuple[int, int]  # (pid, tid)


class Usage(NamedTuple):
    """What a thread used between two snapshots."""

    cpu_s: float
    waited_s: float = 0.0  # ready to run, waiting for a core
    runs: int = 0  # times it was put on a core


@dataclass
class GroupCpu:
    """One thread group of one kind of process over a level; idle_* are the baseline for the same wall
    time, net_* what the level's requests are charged."""

    kind: str
    group: str
    level_s: float = 0.0
    idle_s: float = 0.0
    level_waited_s: float = 0.0
    idle_waited_s: float = 0.0
    level_runs: int = 0
    idle_runs: float = 0.0
    pids: set[int] = field(default_factory=set)
    threads: int = 0

    @property
    def net_s(self) -> float:
        """CPU seconds charged to the level's requests."""
        return self.level_s - self.idle_s

    @property
    def net_waited_s(self) -> float:
        """Seconds its threads were ready to run but waited for a core, beyond the idle baseline's."""
        return self.level_waited_s - self.idle_waited_s

    @property
    def net_runs(self) -> float:
        """Times its threads were put on a core, beyond the idle baseline's."""
        return self.level_runs - self.idle_runs

    def add(self, level: Usage, idle: Usage, scale: float) -> None:
        """Count one thread: its level usage, and its idle usage scaled to the level's wall time."""
        self.level_s += level.cpu_s
        self.idle_s += idle.cpu_s * scale
        self.level_waited_s += level.waited_s
        self.idle_waited_s += idle.waited_s * scale
        self.level_runs += level.runs
        self.idle_runs += idle.runs * scale


@dataclass
class LevelLoad:
    """What the client sent and received over a level."""

    concurrency: int
    requests: int
    errors: int
    chunks: int  # streamed chunks as the client received them
    tokens: int  # completion tokens, from the usage the server reported
    wall_s: float


def usage(thread: Thread, earlier: Thread | None) -> Usage:
    """A thread's use since `earlier` (from zero for a thread that is new)."""
    if earlier is None:
        return Usage(thread.cpu_s, thread.waited_s, thread.runs)
    return Usage(thread.cpu_s - earlier.cpu_s, thread.waited_s - earlier.waited_s, thread.runs - earlier.runs)


def cpu_deltas(before: Snapshot, after: Snapshot) -> dict[ThreadKey, Usage]:
    """Each thread's use between the snapshots, and per process whose threads changed the CPU seconds
    of threads that ended in between (under tid `ENDED_TID`)."""
    deltas = {key: usage(thread, before.threads.get(key)) for key, thread in after.threads.items()}
    live: dict[int, float] = {}
    for (pid, _), used in deltas.items():
        live[pid] = live.get(pid, 0.0) + used.cpu_s
    for pid, process in after.processes.items():
        if not threads_changed(pid, before, after):
            continue
        earlier_process = before.processes.get(pid)
        grown = process.cpu_s - (earlier_process.cpu_s if earlier_process else 0.0)
        deltas[(pid, ENDED_TID)] = Usage(round(grown - live.get(pid, 0.0), 6))
    return deltas


def threads_changed(pid: int, before: Snapshot, after: Snapshot) -> bool:
    """Whether a thread of `pid` started or ended between the snapshots (or the process is new)."""
    return {t for p, t in before.threads if p == pid} != {t for p, t in after.threads if p == pid}


def group_cpu(
    level: dict[ThreadKey, Usage],
    idle: dict[ThreadKey, Usage],
    level_wall_s: float,
    idle_wall_s: float,
    names: Snapshot,
) -> list[GroupCpu]:
    """Sum each thread's level use and its idle baseline (idle rate x level wall time) into groups by
    process kind and thread group, named from `names` (the snapshot at the level's end); busiest first."""
    groups: dict[tuple[str, str], GroupCpu] = {}
    scale = level_wall_s / idle_wall_s if idle_wall_s > 0 else 0.0
    for key, used in level.items():
        pid, tid = key
        process = names.processes.get(pid)
        if process is None:
            continue
        name = ENDED_THREADS if tid == ENDED_TID else thread_group(names.threads[key].name, pid, tid)
        group = groups.setdefault((process.kind, name), GroupCpu(process.kind, name))
        group.add(used, idle.get(key, Usage(0.0)), scale)
        group.pids.add(pid)
        group.threads += tid != ENDED_TID
    return sorted(groups.values(), key=lambda group: -group.net_s)


def per_request_ms(seconds: float, load: LevelLoad) -> float | None:
    """CPU milliseconds per completed request."""
    done = load.requests - load.errors
    return seconds * 1000 / done if done else None


def per_chunk_us(seconds: float, load: LevelLoad) -> float | None:
    """CPU microseconds per streamed chunk the client received."""
    return seconds * 1e6 / load.chunks if load.chunks else None


def per_chunk(count: float, load: LevelLoad) -> float | None:
    """A count (runs, say) per streamed chunk the client received."""
    return count / load.chunks if load.chunks else None
