"""What the scale benchmark reads from outside the stack at the edges of each phase: Redis's INFO
(commands, CPU, memory) and the CPU time of the stack's processes, and the differences between two
such samples."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Sample:
    """One reading, taken at `at` (monotonic seconds)."""

    at: float
    # Calls of every command Redis ran, by name, from INFO commandstats: the commands that scripts
    # run (redis.call) are counted under their own names, the script call itself under EVALSHA.
    calls: dict[str, int]
    # Requests from clients (INFO stats total_commands_processed): a script call is one.
    requests: int
    redis_cpu_s: float
    used_memory: int
    used_memory_peak: int
    connected_clients: int
    process_cpu_s: dict[str, float]  # by part of the stack (see `take`)
    machine_cpu_s: float  # busy CPU seconds of the whole machine so far, everyone's work included


async def take(conn: aioredis.Redis, pids: dict[str, list[int]]) -> Sample:
    """Read Redis's INFO and the CPU time so far of each part's processes (this one as "bench")."""
    info: dict[str, Any] = await conn.info("everything")
    calls = {
        name.removeprefix("cmdstat_"): int(stats["calls"])
        for name, stats in info.items()
        if name.startswith("cmdstat_") and isinstance(stats, dict)
    }
    process_cpu = {part: sum(_cpu_s(pid) for pid in part_pids) for part, part_pids in pids.items()}
    own = os.times()
    process_cpu["bench"] = own.user + own.system
    return Sample(
        at=time.monotonic(),
        calls=calls,
        requests=int(info["total_commands_processed"]),
        redis_cpu_s=float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
        used_memory=int(info["used_memory"]),
        used_memory_peak=int(info["used_memory_peak"]),
        connected_clients=int(info["connected_clients"]),
        process_cpu_s=process_cpu,
        machine_cpu_s=_machine_cpu_s(),
    )


def _cpu_s(pid: int) -> float:
    """User and system CPU seconds of one process so far (0 once it has gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the command name: state is field 3, utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _machine_cpu_s() -> float:
    """Busy CPU seconds of every core so far (all but idle and iowait), from /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0.0
    ticks = [int(value) for value in fields[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / CLOCK_TICKS


def between(first: Sample, last: Sample) -> dict[str, Any]:
    """What happened from one sample to the next: rates per second, and the top commands."""
    seconds = max(last.at - first.at, 1e-9)
    calls = {name: count - first.calls.get(name, 0) for name, count in last.calls.items()}
    calls = {name: count for name, count in calls.items() if count > 0}
    top = dict(sorted(calls.items(), key=lambda item: -item[1])[:8])
    return {
        "seconds": round(seconds, 3),
        "commands": sum(calls.values()),
        "commands_per_s": round(sum(calls.values()) / seconds, 1),
        "requests_per_s": round((last.requests - first.requests) / seconds, 1),
        "redis_cpu": round((last.redis_cpu_s - first.redis_cpu_s) / seconds, 3),
        "used_memory": last.used_memory,
        "used_memory_peak": last.used_memory_peak,
        "connected_clients": last.connected_clients,
        "process_cpu": {
            part: round((last.process_cpu_s[part] - first.process_cpu_s.get(part, 0.0)) / seconds, 3)
            for part in last.process_cpu_s
        },
        # Cores busy on the whole machine: the stack's, and whatever else runs there.
        "machine_cpu": round((last.machine_cpu_s - first.machine_cpu_s) / seconds, 3),
        "top_commands_per_s": {name: round(count / seconds, 1) for name, count in top.items()},
    }
