"""CPU time of a process tree and of each of its threads, read from Linux's /proc.

A thread's CPU time is its `utime + stime` in `/proc/<pid>/task/<tid>/stat`, in clock ticks (10 ms
here), or, where the kernel has it, the nanoseconds on a CPU in the same folder's `schedstat` (the
runtime those ticks are scaled from, without their rounding: a thread that ran 3 ms per second shows
as 0 or 10 ms per tick). Its name is the stat file's `comm`, the name the thread gave itself, cut to
15 characters by the kernel. A process's own stat counts all its threads, those that ended too.
schedstat also says how long the thread waited for a core while ready to run, and how many times it
was put on one (a thread that sleeps and is woken once per chunk runs at least once per chunk).
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MAIN_THREAD = "main thread"


@dataclass(frozen=True)
class Stat:
    """What the benchmark reads from one stat line."""

    comm: str
    ppid: int
    cpu_s: float  # user + system


@dataclass(frozen=True)
class Process:
    """One process of the tree, with what it is."""

    pid: int
    ppid: int
    kind: str
    argv: tuple[str, ...]
    cpu_s: float


@dataclass(frozen=True)
class Thread:
    """One thread's CPU time so far."""

    pid: int
    tid: int
    name: str
    cpu_s: float
    # From schedstat, where the kernel has it: time it was ready to run but waited for a core, and
    # how many times it got one (each wake-up from a wait is one more).
    waited_s: float = 0.0
    runs: int = 0


@dataclass
class Snapshot:
    """Every process of the tree and every one of their threads, at one moment."""

    processes: dict[int, Process]
    threads: dict[tuple[int, int], Thread]


def parse_stat(text: str) -> Stat:
    """The command name, parent pid and CPU seconds of a `/proc/<pid>[/task/<tid>]/stat` line."""
    # The name is in parentheses and may hold spaces and parentheses itself: it ends at the last ')'.
    opening, closing = text.index("("), text.rindex(")")
    fields = text[closing + 2 :].split()  # from field 3 (state) on: field n is fields[n - 3]
    ticks = int(fields[11]) + int(fields[12])  # fields 14 and 15: utime and stime
    return Stat(comm=text[opening + 1 : closing], ppid=int(fields[1]), cpu_s=ticks / CLOCK_TICKS)


def parse_machine_cpu(text: str) -> tuple[float, float]:
    """(busy, all) core-seconds since boot from /proc/stat's first line (`cpu user nice system idle
    iowait irq softirq steal ...`); busy leaves out idle and iowait."""
    values = [int(value) for value in text.splitlines()[0].split()[1:9]]
    idle = values[3] + values[4]
    return (sum(values) - idle) / CLOCK_TICKS, sum(values) / CLOCK_TICKS


def machine_cpu() -> tuple[float, float]:
    """(busy, all) core-seconds of the whole machine since boot."""
    return parse_machine_cpu((PROC / "stat").read_text())


def classify(argv: tuple[str, ...], comm: str) -> str:
    """What a process of the Switchboard stack is, from its command line and name."""
    program = Path(argv[0]).name if argv else comm
    named = {
        "py-spy": "profiler (py-spy)",
        "redis-server": "redis-server",
        "tritonserver": "tritonserver",
        "triton_python_backend_stub": "Python backend stub",
    }
    if program in named:
        return named[program]
    if comm.startswith("redis-server"):
        return "redis-server"
    if comm.startswith(("VLLM::EngineCor", "EngineCore")):
        return "vLLM engine core"
    if comm.startswith("VLLM::Worker"):
        return "vLLM model runner"  # vLLM's own server runs the model in a process of its own
    if "vllm.entrypoints.openai.api_server" in argv or (program == "vllm" and "serve" in argv):
        return "vLLM API server"
    if "switchboard::pooling::" in comm or program.startswith("switchboard::pooling::"):
        return "pooling model process"
    if comm.startswith("switchboard::") or program.startswith("switchboard::"):
        return "engine fork server"
    if "workers.main" in argv or ("switchboard" in argv and "worker" in argv):
        return "worker"
    if "switchboard" in argv and "router" in argv:
        return "front door"
    return "other: " + " ".join([program, *argv[1:4]])[:60]


def thread_group(name: str, pid: int, tid: int) -> str:
    """The group a thread's CPU is shown in: its name with numbers as N, so that a pool's threads
    ("ThreadPoolExecutor-0_3", "Thread-3 (worker)") add up; a process's first thread is its main one."""
    if tid == pid:
        return MAIN_THREAD
    return re.sub(r"\d+", "N", name)


def renamed(snap: Snapshot, names: dict[int, str]) -> Snapshot:
    """`snap` with the threads in `names` (thread id: name) called so; the others keep their `comm`.

    Python 3.11 does not give its threads' names to the kernel (all are "python"), but py-spy reads them.
    """
    threads = {
        key: Thread(t.pid, t.tid, names.get(t.tid, t.name), t.cpu_s, t.waited_s, t.runs)
        for key, t in snap.threads.items()
    }
    return Snapshot(snap.processes, threads)


def descendants(root: int, parents: dict[int, int]) -> list[int]:
    """`root` and every process below it, from each pid's parent."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, queue = [], [root]
    while queue:
        pid = queue.pop()
        found.append(pid)
        queue.extend(children.get(pid, []))
    return sorted(found)


def read_stat(path: Path) -> Stat | None:
    """A stat file's line, or None if its process or thread has gone."""
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        return parse_stat(path.read_text())
    return None


def read_thread_cpu(task: Path) -> Thread | None:
    """One thread's name and CPU seconds (from schedstat where there is one), or None if it has gone."""
    stat = read_stat(task / "stat")
    if stat is None:
        return None
    pid, tid = int(task.parent.parent.name), int(task.name)
    with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        cpu_s, waited_s, runs = parse_schedstat((task / "schedstat").read_text())
        return Thread(pid, tid, stat.comm, cpu_s, waited_s, runs)
    return Thread(pid, tid, stat.comm, stat.cpu_s)


def parse_schedstat(text: str) -> tuple[float, float, int]:
    """(seconds on a core, seconds ready but waiting for one, times run) from a schedstat line
    (`ns-on-cpu ns-waiting timeslices`)."""
    on_cpu, waiting, runs = text.split()[:3]
    return int(on_cpu) / 1e9, int(waiting) / 1e9, int(runs)


def read_argv(pid: int) -> tuple[str, ...]:
    """A process's command line (empty if it has gone)."""
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        return tuple(part for part in (PROC / str(pid) / "cmdline").read_bytes().decode().split("\0") if part)
    return ()


def all_parents() -> dict[int, int]:
    """Every process on the machine (that we may see) and its parent."""
    parents = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (stat := read_stat(entry / "stat")) is not None:
            parents[int(entry.name)] = stat.ppid
    return parents


def snapshot(root: int, root_kind: str) -> Snapshot:
    """The CPU time of `root` (shown as `root_kind`), every process below it and all their threads, now."""
    processes: dict[int, Process] = {}
    threads: dict[tuple[int, int], Thread] = {}
    for pid in descendants(root, all_parents()):
        stat = read_stat(PROC / str(pid) / "stat")
        if stat is None:
            continue
        argv = read_argv(pid)
        kind = root_kind if pid == root else classify(argv, stat.comm)
        processes[pid] = Process(pid, stat.ppid, kind, argv, stat.cpu_s)
        with contextlib.suppress(FileNotFoundError):
            for task in (PROC / str(pid) / "task").iterdir():
                if (thread := read_thread_cpu(task)) is not None:
                    threads[(pid, thread.tid)] = thread
    return Snapshot(processes, threads)
