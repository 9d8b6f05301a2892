"""CPU a level of load cost each process and thread group, less what they spend with no load at all.

Between two snapshots each thread's CPU grows by some seconds. A process's own counter also holds its
threads that ended in between: where threads came or went, the counter's growth less its live
threads' is shown as a group of its own. That counter is in whole clock ticks (10 ms), so where no
thread came or went the difference is rounding and is left out. The idle baseline is the same reading
over a stretch with no requests: each thread's idle rate times the level's wall time is background
work (polling, timers) that would have happened anyway, and is not charged to the requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proc_cpu import Snapshot, thread_group

ENDED_TID = -1  # the pseudo-thread that stands for a process's threads that ended
ENDED_THREADS = "(threads that ended)"

ThreadKey = tuple[int, int]  # (pid, tid)


@dataclass
class GroupCpu:
    """One thread group of one kind of process over a level."""

    kind: str
    group: str
    level_s: float = 0.0  # CPU seconds over the level
    idle_s: float = 0.0  # the idle baseline for the same wall time
    pids: set[int] = field(default_factory=set)
    threads: int = 0

    @property
    def net_s(self) -> float:
        """CPU seconds charged to the level's requests."""
        return self.level_s - self.idle_s


@dataclass
class LevelLoad:
    """What the client sent and received over a level."""

    concurrency: int
    requests: int
    errors: int
    chunks: int  # streamed chunks as the client received them
    tokens: int  # completion tokens, from the usage the server reported
    wall_s: float


def cpu_deltas(before: Snapshot, after: Snapshot) -> dict[ThreadKey, float]:
    """Each thread's CPU seconds between the snapshots (new threads from zero), and per process whose
    threads changed the seconds of threads that ended in between (under tid `ENDED_TID`)."""
    deltas: dict[ThreadKey, float] = {}
    for key, thread in after.threads.items():
        earlier = before.threads.get(key)
        deltas[key] = thread.cpu_s - (earlier.cpu_s if earlier else 0.0)
    live: dict[int, float] = {}
    for (pid, _), seconds in deltas.items():
        live[pid] = live.get(pid, 0.0) + seconds
    for pid, process in after.processes.items():
        if not threads_changed(pid, before, after):
            continue
        earlier_process = before.processes.get(pid)
        grown = process.cpu_s - (earlier_process.cpu_s if earlier_process else 0.0)
        # Thread and process counters are read moments apart: a tick or two either way is noise.
        deltas[(pid, ENDED_TID)] = round(grown - live.get(pid, 0.0), 6)
    return deltas


def threads_changed(pid: int, before: Snapshot, after: Snapshot) -> bool:
    """Whether a thread of `pid` started or ended between the snapshots (or the process is new)."""
    return {t for p, t in before.threads if p == pid} != {t for p, t in after.threads if p == pid}


def group_cpu(
    level: dict[ThreadKey, float],
    idle: dict[ThreadKey, float],
    level_wall_s: float,
    idle_wall_s: float,
    names: Snapshot,
) -> list[GroupCpu]:
    """Sum each thread's level CPU and its idle baseline (idle rate x level wall time) into groups by
    process kind and thread group, named from `names` (the snapshot at the level's end); busiest first."""
    groups: dict[tuple[str, str], GroupCpu] = {}
    scale = level_wall_s / idle_wall_s if idle_wall_s > 0 else 0.0
    for key, seconds in level.items():
        pid, tid = key
        process = names.processes.get(pid)
        if process is None:
            continue
        if tid == ENDED_TID:
            if seconds == 0 and idle.get(key, 0.0) == 0:
                continue
            name = ENDED_THREADS
        else:
            name = thread_group(names.threads[key].name, pid, tid)
        group = groups.setdefault((process.kind, name), GroupCpu(process.kind, name))
        group.level_s += seconds
        group.idle_s += idle.get(key, 0.0) * scale
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
