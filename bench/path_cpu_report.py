"""The path CPU benchmark's figures: a table of CPU per request and per chunk by process and thread
group, a line per level on its load, the profiles' top frames, and the results file's levels."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cpu_accounting import GroupCpu, LevelLoad, per_chunk, per_chunk_us, per_request_ms

LOAD_GENERATOR = "load generator (this script)"
PROFILER = "profiler (py-spy)"
NOT_THE_STACK = (LOAD_GENERATOR, PROFILER)
GROUPS_SHOWN = 6  # thread groups per process in the table; the rest are summed
NEGLIGIBLE_S = 0.002  # a thread group with less net CPU than this at every level is left out
FRAMES_PER_GROUP = 5


@dataclass
class LevelCpu:
    """One level's load, its CPU by group (net of the idle baseline) and its profiles."""

    load: LevelLoad
    groups: list[GroupCpu]
    idle_wall_s: float
    machine_busy_s: float
    machine_all_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    processes: list[dict[str, Any]]
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Totals:
    """Net CPU seconds and runs on a core of some groups over one level."""

    cpu_s: float = 0.0
    runs: float = 0.0

    def add(self, group: GroupCpu) -> None:
        self.cpu_s += group.net_s
        self.runs += group.net_runs


Row = tuple[str, list[Totals]]  # a label and its totals at each level


def totals_by(levels: list[LevelCpu], key: str, kind: str | None = None) -> dict[str, list[Totals]]:
    """Totals per process kind (`key` "kind") or per thread group of `kind` (`key` "group"), per level."""
    found: dict[str, list[Totals]] = {}
    for index, level in enumerate(levels):
        for group in level.groups:
            if kind is None or group.kind == kind:
                name = getattr(group, key)
                found.setdefault(name, [Totals() for _ in levels])[index].add(group)
    return found


def table_rows(levels: list[LevelCpu]) -> list[Row]:
    """Each process kind, its busiest thread groups and the rest of its threads, then the stack's
    total; kinds in order of their most CPU at any level, the load generator and py-spy last."""
    kinds = totals_by(levels, "kind")
    ordered = sorted(kinds, key=lambda k: (k in NOT_THE_STACK, -max(t.cpu_s for t in kinds[k])))
    rows: list[Row] = []
    for kind in ordered:
        rows.append((f"**{kind}**", kinds[kind]))
        rows.extend(group_rows(kind, levels))
    stack = [Totals() for _ in levels]
    for index, level in enumerate(levels):
        for group in level.groups:
            if group.kind not in NOT_THE_STACK:
                stack[index].add(group)
    rows.append(("**stack total** (all but the load generator)", stack))
    return rows


def group_rows(kind: str, levels: list[LevelCpu]) -> list[Row]:
    """A kind's busiest thread groups, then the rest summed (if any); none for a single group."""
    groups = totals_by(levels, "group", kind)
    if len(groups) <= 1:
        return []
    ranked = sorted(groups, key=lambda name: -max(t.cpu_s for t in groups[name]))
    # Groups that round to nothing at every level are noise in the table (the JSON keeps them).
    ranked = [name for name in ranked if max(abs(t.cpu_s) for t in groups[name]) >= NEGLIGIBLE_S]
    rows = [(f"&nbsp;&nbsp;{name}", groups[name]) for name in ranked[:GROUPS_SHOWN]]
    rest = ranked[GROUPS_SHOWN:]
    if rest:
        others = [Totals() for _ in levels]
        for name in rest:
            for index, totals in enumerate(groups[name]):
                others[index].cpu_s += totals.cpu_s
                others[index].runs += totals.runs
        rows.append((f"&nbsp;&nbsp;{len(rest)} other thread groups", others))
    return rows


def cell(value: float | None, digits: int) -> str:
    """A figure, or a dash."""
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(levels: list[LevelCpu]) -> str:
    """The table (net CPU per request and per chunk, runs on a core per chunk, at each level) and a
    line per level on its load."""
    head = ["process / thread group"]
    for level in levels:
        c = level.load.concurrency
        head += [f"c={c} CPU ms/request", f"c={c} CPU µs/chunk", f"c={c} runs/chunk"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for label, totals in table_rows(levels):
        cells = [label]
        for level, total in zip(levels, totals, strict=True):
            cells.append(cell(per_request_ms(total.cpu_s, level.load), 2))
            cells.append(cell(per_chunk_us(total.cpu_s, level.load), 0))
            cells.append(cell(per_chunk(total.runs, level.load), 2))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.extend(describe(level) for level in levels)
    return "\n".join(lines) + "\n"


def describe(level: LevelCpu) -> str:
    """One line on a level's load, the stack's wait for a core and the machine's CPU over it."""
    load = level.load
    done = max(load.requests - load.errors, 1)
    stack = [group for group in level.groups if group.kind not in NOT_THE_STACK]
    idle = sum(group.idle_s for group in stack)
    # Not net of the idle baseline: the wait depends on what else runs then, not on background work.
    waited = sum(group.level_waited_s for group in stack)
    busy = level.machine_busy_s / level.machine_all_s * 100 if level.machine_all_s else 0.0
    return (
        f"- c={load.concurrency}: {load.requests} requests ({load.errors} failed) in {load.wall_s:.1f} s, "
        f"{load.chunks / done:.1f} chunks and {load.tokens / done:.1f} tokens per request; TTFT p50 "
        f"{cell(level.ttft_p50_ms, 1)} ms, p99 {cell(level.ttft_p99_ms, 1)} ms; the stack's threads "
        f"waited {waited * 1000 / done:.1f} ms per request for a core while ready to run; machine busy "
        f"{level.machine_busy_s:.1f} of {level.machine_all_s:.1f} core-s ({busy:.0f}%, every process "
        f"on it, others' included); idle baseline subtracted: {idle:.2f} CPU-s."
    )


def profile_summary(levels: list[LevelCpu], count: int = 10) -> str:
    """Per level and profiled process: its top frames by self time overall and per thread group."""
    lines = []
    for level in levels:
        for kind, profile in level.profiles.items():
            lines.append(f"\n### c={level.load.concurrency}, {kind}: top {count} frames by self time\n")
            if profile["error"]:
                lines.append(f"no profile: {profile['error']}")
                continue
            run = profile["pass"]
            lines.append(
                f"`{profile['file']}`: {profile['samples']} samples at {run['rate_hz']} Hz over "
                f"{run['wall_s']:.1f} s (in this pass TTFT p50 {cell(run['ttft_p50_ms'], 1)} ms, p99 "
                f"{cell(run['ttft_p99_ms'], 1)} ms, max {cell(run['ttft_max_ms'], 1)} ms)\n"
            )
            lines.append("| self samples | share | frame |\n|---:|---:|---|")
            for frame in profile["top_self_frames"][:count]:
                lines.append(f"| {frame['samples']} | {frame['share'] * 100:.1f}% | `{frame['frame']}` |")
            lines.append("\nBy thread group (samples; top frames by self samples):\n")
            for name, group in profile["thread_groups"].items():
                tops = ", ".join(f"`{f['frame']}` {f['samples']}" for f in group["top_self_frames"])
                lines.append(f"- {name}: {group['samples']}; {tops}")
    return "\n".join(lines) + "\n"


def as_json(level: LevelCpu) -> dict[str, Any]:
    """A level for the results file: its groups raw and per request and chunk, its processes, profiles."""
    groups = [
        {
            "kind": g.kind,
            "group": g.group,
            "pids": sorted(g.pids),
            "threads": g.threads,
            "level_cpu_s": round(g.level_s, 4),
            "idle_baseline_cpu_s": round(g.idle_s, 4),
            "net_cpu_s": round(g.net_s, 4),
            "ms_per_request": per_request_ms(g.net_s, level.load),
            "us_per_chunk": per_chunk_us(g.net_s, level.load),
            "level_runs": g.level_runs,
            "idle_baseline_runs": round(g.idle_runs, 1),
            "runs_per_chunk": per_chunk(g.net_runs, level.load),
            "waited_for_core_ms_per_request": per_request_ms(g.net_waited_s, level.load),
        }
        for g in level.groups
    ]
    return {
        "load": level.load.__dict__,
        "idle_wall_s": level.idle_wall_s,
        "ttft_p50_ms": level.ttft_p50_ms,
        "ttft_p99_ms": level.ttft_p99_ms,
        "machine_busy_core_s": round(level.machine_busy_s, 3),
        "machine_all_core_s": round(level.machine_all_s, 3),
        "groups": groups,
        "processes": level.processes,
        "profiles": level.profiles,
    }
