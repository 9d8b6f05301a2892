"""Scale benchmark of Switchboard's control plane: what Redis and the controllers pay as the numbers of
workers and configured models grow.

    python bench/scale.py --quick                   # 2,10 workers x 10,300 models, about a minute
    python bench/scale.py                           # the bigger grid (several minutes)
    python bench/scale.py --compare bench/results/scale-before.json bench/results/scale-after.json

What is real: one redis-server; the front door(s) (`switchboard router` processes, the product's own);
in every simulated worker, the product's `workers.main.Worker` with its model controller, job consumer,
job runner, result writer, heartbeat, takeover sweep and model slots, from the same configuration file
as the front doors. What is simulated: the engine (a scripted one: loads take a time drawn per model
from --load-range, tokens come at a fixed pace), the hop through the worker's Triton (the job goes
straight into the product's Triton callable, `EngineCallable`, on the worker's event loop instead of
over gRPC into a Triton process), and the machine: many workers share one OS process and its event
loop (--processes of them share the workers), all processes share this machine's cores with Redis and the front doors.

Each grid point starts a fresh stack, then measures three phases: idle (nothing sent), open loop
(Poisson arrivals at --rate over models drawn by Zipf popularity, with short keep-alives so models load
and unload), closed loop (--closed-clients back to back on the most popular model, for requests/s).
Controller passes are timed by wrapping `ModelController.step` in the fleet processes; loads are
read from the controller's own action log records. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from loadgen import percentile
from scale_load import Load, Zipf
from scale_metrics import cold_waits, holdings, load_storms, pass_stats, request_stats
from scale_report import markdown_table, svg_chart
from scale_samples import Sample, between, take
from scale_stack import Shape, Stack, StackError, model_names, running_stack

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
BASELINE = RESULTS / "scale-before.json"

QUICK = {
    "workers": [2, 10],
    "models": [10, 300],
    "settle_s": 0.5,
    "idle_s": 2.0,
    "load_s": 4.0,
    "drain_s": 2.0,
    "closed_s": 2.0,
}
FULL = {
    "workers": [2, 10, 50, 100],
    "models": [10, 100, 1000],
    "settle_s": 2.0,
    "idle_s": 5.0,
    "load_s": 15.0,
    "drain_s": 8.0,
    "closed_s": 6.0,
}

# Simulated workers are CPU-bound when a process of them is this busy (cores), when the stack takes
# this share of the machine's cores, or when their idle passes take this long.
SATURATED_CPU = 0.75
SATURATED_MACHINE = 0.8
SATURATED_PASS_MS = 500.0


def progress(text: str) -> None:
    """One progress line, at once."""
    print(f"    {text}", flush=True)


async def measure_phases(stack: Stack, models: int, args: argparse.Namespace) -> dict[str, Any]:
    """Idle, open loop, closed loop on a running stack: the samples and requests of each."""
    rng = random.Random(args.seed)
    zipf = Zipf(model_names(models), args.zipf, rng)
    hot = model_names(1)[0]
    load = Load(stack.base_urls, args.max_tokens, timeout_s=args.request_timeout_s + 5)
    pids = stack.pids()
    async with aioredis.Redis.from_url(stack.redis_url) as conn:
        await asyncio.sleep(args.settle_s)
        marks: list[tuple[str, Sample, float]] = [("idle", await take(conn, pids), time.time())]
        await asyncio.sleep(args.idle_s)
        marks.append(("open_loop", await take(conn, pids), time.time()))
        open_s = await load.open_loop(zipf, args.rate, args.load_s, args.drain_s, rng)
        open_sent, load.sent = load.sent, []
        stack.check()
        await load.one(hot)  # the hot model warm before the closed loop (it almost always is)
        load.sent = []
        marks.append(("closed_loop", await take(conn, pids), time.time()))
        closed_s = await load.closed_loop(hot, args.closed_clients, args.closed_s)
        marks.append(("end", await take(conn, pids), time.time()))
    await load.aclose()
    stack.check()
    return {
        "marks": marks,
        "open_sent": open_sent,
        "open_s": open_s,
        "closed_sent": load.sent,
        "closed_s": closed_s,
    }


def figures(measured: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """Every figure of one point from its samples, requests and the fleets' records."""
    marks = measured["marks"]
    phases: dict[str, dict[str, Any]] = {}
    for (name, first, began), (_, last, ended) in itertools.pairwise(marks):
        phases[name] = {
            **between(first, last),
            **pass_stats(records, began, ended),
            "began": began,
            "ended": ended,
        }
    idle, open_loop, closed = phases["idle"], phases["open_loop"], phases["closed_loop"]
    open_loop.update(request_stats(measured["open_sent"], measured["open_s"]))
    closed.update(request_stats(measured["closed_sent"], measured["closed_s"]))
    for phase in (open_loop, closed):
        answered = max(phase["ok"], 1)
        phase["commands_per_request"] = round(phase["commands"] / answered, 1)
        above_idle = phase["commands"] - idle["commands_per_s"] * phase["seconds"]
        phase["commands_per_request_above_idle"] = round(max(above_idle, 0.0) / answered, 1)
    held = holdings(records)
    waits, never = cold_waits(measured["open_sent"], held)
    waits_ms = sorted(wait * 1000 for wait in waits)
    open_loop["cold_requests"] = len(waits)
    open_loop["cold_never_loaded"] = never
    open_loop["cold_wait_p50_ms"] = percentile(waits_ms, 50)
    open_loop["cold_wait_p99_ms"] = percentile(waits_ms, 99)
    open_loop["cold_wait_max_ms"] = round(waits_ms[-1], 1) if waits_ms else None
    starts = [
        span for spans in held.values() for span in spans if open_loop["began"] <= span.start < marks[-1][2]
    ]
    storms, replicas = load_storms(held)
    return {
        "idle": idle,
        "open_loop": open_loop,
        "closed_loop": closed,
        "loads": len(starts),
        "load_storms": len(storms),
        "storms": storms,
        "added_replicas": replicas,
        "redis_used_memory_peak": marks[-1][1].used_memory_peak,
        "fleet_cpu_s": round(sum(record["cpu_s"] for record in records), 2),
    }


def describe(point: dict[str, Any]) -> list[str]:
    """Progress lines for a measured point."""
    idle, load, closed = point["idle"], point["open_loop"], point["closed_loop"]
    cpu = ", ".join(f"{part} {value:.2f}" for part, value in load["process_cpu"].items())
    return [
        f"idle: {idle['commands_per_s']:,.0f} Redis cmd/s, Redis CPU {idle['redis_cpu']:.2f}, "
        f"{idle['passes_per_s']:.1f} passes/s (p50 {idle['pass_p50_ms']} ms)",
        f"open loop: {load['ok']}/{load['requests']} ok ({load['failed']} failed, {load['unfinished']} unfinished), "
        f"{load['commands_per_s']:,.0f} cmd/s, {load['commands_per_request_above_idle']:,.0f} cmd/req above idle, "
        f"passes p50/p99 {load['pass_p50_ms']}/{load['pass_p99_ms']} ms, "
        f"cold→load p50/p99 {load['cold_wait_p50_ms']}/{load['cold_wait_p99_ms']} ms over {load['cold_requests']}, "
        f"{point['loads']} loads, {point['load_storms']} storms",
        f"closed loop: {closed['ok_per_s']:.0f} req/s, {closed['commands_per_request']:,.0f} cmd/req, "
        f"latency p50 {closed['latency_p50_ms']} ms",
        f"CPU (cores) under load: {cpu}, Redis {load['redis_cpu']:.2f}; machine load before {point['load_1m_before']}; "
        f"Redis peak memory {point['redis_used_memory_peak'] / 1024**2:.1f} MiB",
        "top commands under load: "
        + ", ".join(f"{k} {v:,.0f}/s" for k, v in load["top_commands_per_s"].items()),
    ]


def run_point(workers: int, models: int, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """Start one point's stack, measure it, stop it; its figures."""
    shape = Shape(
        front_doors=args.front_doors,
        processes=args.processes,
        models_per_worker=args.models_per_worker,
        max_loaded_models=args.max_loaded_models,
        keep_alive_s=args.keep_alive_s,
        load_s=args.load_range,
        token_s=args.token_ms / 1000,
        request_timeout_s=args.request_timeout_s,
    )
    load_1m = round(os.getloadavg()[0], 2)
    with running_stack(workers, models, shape, log_dir / f"w{workers}-m{models}", progress) as stack:
        measured = asyncio.run(measure_phases(stack, models, args))
    point = {"workers": workers, "models": models, "processes": len(stack.fleets), "load_1m_before": load_1m}
    point |= figures(measured, stack.records)
    point["saturated"] = saturated(point)
    return point


def saturated(point: dict[str, Any]) -> bool:
    """Whether the simulated workers' processes were CPU-bound (their passes then come less often and
    Redis sees less than real workers, one per process, would send)."""
    load = point["open_loop"]
    per_process = load["process_cpu"].get("workers", 0.0) / max(point["processes"], 1)
    stack_cores = sum(load["process_cpu"].values()) + load["redis_cpu"]
    idle_pass_ms = point["idle"]["pass_p50_ms"] or 0.0
    return (
        per_process >= SATURATED_CPU
        or stack_cores >= SATURATED_MACHINE * (os.cpu_count() or 1)
        or idle_pass_ms >= SATURATED_PASS_MS
    )


def git_label() -> tuple[str, str]:
    """The checkout's short commit, with "-dirty" when it has uncommitted changes."""

    def git(*argv: str) -> str:
        return subprocess.run(
            ["git", *argv], cwd=REPO, capture_output=True, text=True, check=False
        ).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return commit, commit + ("-dirty" if dirty else "")


def float_pair(text: str) -> tuple[float, float]:
    """Parse "0.2,1" into (0.2, 1.0)."""
    low, high = (float(part) for part in text.split(","))
    return low, high


def int_list(text: str) -> list[int]:
    """Parse "2,10" into [2, 10]."""
    return [int(part) for part in text.split(",")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line settings; --quick changes the defaults of the grid and the phases."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--quick", action="store_true", help="a short run: 2,10 workers x 10,300 models, short phases")
    add("--workers", type=int_list, help="simulated workers per point (default 2,10,50,100; quick 2,10)")
    add("--models", type=int_list, help="configured models per point (default 10,100,1000; quick 10,300)")
    add(
        "--max-slots", type=int, default=30_000, help="skip points with more workers x models (default 30000)"
    )
    add("--front-doors", type=int, default=1, help="front door processes (default 1)")
    add(
        "--processes",
        type=int,
        default=os.cpu_count() or 1,
        help="OS processes the workers share (default: the cores)",
    )
    add("--models-per-worker", type=int, default=0, help="models each worker may hold (default 0: all)")
    add("--max-loaded-models", type=int, default=4, help="models a worker holds at once (default 4)")
    add("--keep-alive-s", type=float, default=3.0, help="models' keep_alive_s (default 3)")
    add(
        "--load-range",
        type=float_pair,
        default=(0.2, 1.0),
        help="a load takes LOW,HIGH seconds (default 0.2,1)",
    )
    add("--token-ms", type=float, default=2.0, help="the scripted engine's pause per token (default 2)")
    add("--max-tokens", type=int, default=4, help="max_tokens of every request (default 4)")
    add("--rate", type=float, default=10.0, help="open loop: requests per second, all models (default 10)")
    add("--zipf", type=float, default=1.1, help="open loop: Zipf exponent of model popularity (default 1.1)")
    add("--closed-clients", type=int, default=16, help="closed loop: clients (default 16)")
    add("--request-timeout-s", type=float, default=30.0, help="router.request_timeout_s (default 30)")
    for name in ("settle", "idle", "load", "drain", "closed"):
        add(
            f"--{name}-s",
            type=float,
            help=f"seconds of the {name} phase (quick {QUICK[name + '_s']:g}, default {FULL[name + '_s']:g})",
        )
    add("--seed", type=int, default=1, help="random seed of the arrivals and model draws")
    add("--label", help="names the results (default: the short commit, -dirty with local changes)")
    add(
        "--output",
        type=Path,
        help="results JSON (default bench/results/scale-LABEL.json; .md and .svg beside it)",
    )
    add(
        "--baseline",
        type=Path,
        help="results drawn with this run's (default bench/results/scale-before.json if present)",
    )
    add(
        "--compare",
        type=Path,
        nargs="+",
        help="measure nothing: print the tables of these results and draw them",
    )
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def write_outputs(results: list[dict[str, Any]], json_path: Path | None, stem: Path) -> None:
    """Print each results file's table; write the table and the picture beside `stem`."""
    tables = [f"### {run['label']}\n\n{markdown_table(run)}" for run in results]
    print("\n" + "\n".join(tables))
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".md").write_text("\n".join(tables))
    stem.with_suffix(".svg").write_text(svg_chart(results))
    written = [json_path] if json_path else []
    print(
        "written: " + ", ".join(str(p) for p in [*written, stem.with_suffix(".md"), stem.with_suffix(".svg")])
    )


def main(argv: list[str] | None = None) -> int:
    """Run the grid (or compare results files); returns the exit code."""
    args = parse_args(argv)
    if args.compare:
        runs = [json.loads(path.read_text()) for path in args.compare]
        write_outputs(runs, None, RESULTS / ("scale-compare-" + "-vs-".join(run["label"] for run in runs)))
        return 0
    commit, label = git_label()
    label = args.label or label
    output = args.output or RESULTS / f"scale-{label}.json"
    log_dir = output.with_suffix("")
    grid = [(w, m) for w in args.workers for m in args.models]
    settings = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()}
    settings["load_range_s"] = settings.pop("load_range")
    machine = {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "load_1m_before": os.getloadavg()[0],
    }
    results: dict[str, Any] = {"label": label, "commit": commit, "settings": settings, "machine": machine}
    results["points"], results["skipped"] = [], []
    print(f"scale benchmark {label}: {len(grid)} points; logs in {log_dir}", flush=True)
    started = time.monotonic()
    for number, (workers, models) in enumerate(grid, 1):
        print(f"[{number}/{len(grid)}] {workers} workers x {models} models", flush=True)
        if workers * models > args.max_slots:
            why = f"{workers * models:,} worker-model slots > --max-slots {args.max_slots:,} (beyond this machine)"
            progress(f"skipped: {why}")
            results["skipped"].append({"workers": workers, "models": models, "why": why})
            continue
        try:
            point = run_point(workers, models, args, log_dir)
        except StackError as exc:
            print(f"error: {exc}", file=sys.stderr)
            results["skipped"].append({"workers": workers, "models": models, "why": f"failed: {exc}"})
            continue
        results["points"].append(point)
        for line in describe(point):
            progress(line)
    results["seconds"] = round(time.monotonic() - started, 1)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=1) + "\n")
    baseline = args.baseline or (BASELINE if BASELINE.is_file() and output != BASELINE else None)
    runs = ([json.loads(baseline.read_text())] if baseline else []) + [results]
    write_outputs(runs, output, output.with_suffix(""))
    print(f"took {results['seconds']:.0f} s")
    return 0 if results["points"] else 1


if __name__ == "__main__":
    sys.exit(main())
