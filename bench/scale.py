"""Scale benchmark of Switchboard's control plane: what Redis and the controllers pay as the numbers of
workers and configured models grow.

    python bench/scale.py --quick                   # 2,10 workers x 10,300 models, about a minute
    python bench/scale.py                           # the bigger grid (about 8 minutes on 2 cores)
    python bench/scale.py --compare bench/results/scale-before.json bench/results/scale-after.json

What is real: one redis-server; the front door(s) (`switchboard router` processes, the product's own);
in every simulated worker, the product's `workers.main.Worker` with its model controller, job consumer,
job runner, result writer, heartbeat, takeover sweep and model slots, from the same configuration file
as the front doors. What is simulated: the engine (a scripted one: loads take a time drawn per model
from --load-range, tokens come at a fixed pace), the hop through the worker's Triton (the job goes
straight into the product's Triton callable, `GeneratorModel`, on the worker's event loop instead of
over gRPC into a Triton process), and the machines: the workers share a few OS processes
(--processes, one per core by default) and their event loops, and everything shares this machine's
cores.

Each grid point starts a fresh stack, then measures three phases: idle (nothing sent), open loop
(Poisson arrivals at --rate over models drawn by Zipf popularity, with short keep-alives so models load
and unload), closed loop (--closed-clients back to back on the most popular model, for requests/s).
Controller passes are timed by wrapping `ModelController.step` in the fleet processes; loads are
read from the controller's own action log records. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
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
from scale_load import Load, Zipf
from scale_metrics import contended, figures, saturated
from scale_report import describe, markdown_table, svg_chart
from scale_samples import Sample, take
from scale_stack import Shape, Stack, StackError, model_names, running_stack

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
# The results of the code before the control plane's change, drawn beside every later run's.
BASELINE = {False: RESULTS / "scale-before.json", True: RESULTS / "scale-before-quick.json"}

QUICK = {
    "workers": [2, 10],
    "models": [10, 300],
    "settle_s": 0.5,
    "idle_s": 2.0,
    "load_s": 4.0,
    "drain_s": 2.0,
    "closed_s": 2.0,
    "retries": 0,
}
FULL = {
    "workers": [2, 10, 50, 100],
    "models": [10, 100, 1000],
    "settle_s": 2.0,
    "idle_s": 5.0,
    "load_s": 15.0,
    "drain_s": 8.0,
    "closed_s": 6.0,
    "retries": 1,
}


def progress(text: str) -> None:
    """One progress line, at once."""
    print(f"    {text}", flush=True)


async def measure_phases(stack: Stack, models: int, args: argparse.Namespace) -> dict[str, Any]:
    """Idle, open loop, closed loop on a running stack: the samples and requests of each."""
    zipf = Zipf(model_names(models), args.zipf, random.Random(args.seed))
    load = Load(stack.base_urls, args.max_tokens, timeout_s=args.request_timeout_s + 5)
    pids = stack.pids()
    try:
        return await _phases(stack, load, zipf, pids, args)
    finally:
        await load.aclose()


async def _phases(
    stack: Stack, load: Load, zipf: Zipf, pids: dict[str, list[int]], args: argparse.Namespace
) -> dict[str, Any]:
    rng = random.Random(args.seed + 1)
    hot = model_names(1)[0]
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
    stack.check()
    return {
        "marks": marks,
        "open_sent": open_sent,
        "open_s": open_s,
        "closed_sent": load.sent,
        "closed_s": closed_s,
    }


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
    point["saturated"] = saturated(point, os.cpu_count() or 1)
    point["contended"] = contended(point)
    return point


def measured_point(workers: int, models: int, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """Run a point, again (up to --retries times) while other work on the machine took its cores;
    the least contended run counts."""
    runs = [run_point(workers, models, args, log_dir)]
    while runs[-1]["contended"] and len(runs) <= args.retries:
        others = max(runs[-1][phase]["others_cpu"] for phase in ("idle", "open_loop"))
        progress(f"other work on the machine took {others:.2f} cores meanwhile: measuring again")
        runs.append(run_point(workers, models, args, log_dir))
    best = min(runs, key=lambda run: max(run[phase]["others_cpu"] for phase in ("idle", "open_loop")))
    best["attempts"] = len(runs)
    return best


def what_runs(args: argparse.Namespace) -> str:
    """What is real and what is simulated, in one paragraph for the output and the results."""
    return (
        f"Real: one redis-server, {args.front_doors} front door process(es) (`switchboard router`), and per "
        "simulated worker the product's workers.main.Worker (model controller, job consumer, job runner, "
        "result writer, heartbeat, takeover sweep, model slots). Simulated: the engine (scripted: loads of "
        f"{args.load_range[0]:g}-{args.load_range[1]:g} s, {args.token_ms:g} ms per token), the Triton hop "
        "(jobs go into the product's GeneratorModel in process, not over gRPC into Triton), and the machines "
        f"(the workers share {args.processes} OS process(es) and {os.cpu_count()} cores with everything else)."
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
        "--max-slots", type=int, default=10_000, help="skip points with more workers x models (default 10000)"
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
    add("--retries", type=int, help="runs again of a point that other work contended (quick 0, default 1)")
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
        help="results drawn with this run's (default bench/results/scale-before[-quick].json if present)",
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
    results["what_runs"] = what_runs(args)
    print(
        f"scale benchmark {label}: {len(grid)} points; logs in {log_dir}\n{results['what_runs']}", flush=True
    )
    started = time.monotonic()
    for number, (workers, models) in enumerate(grid, 1):
        print(f"[{number}/{len(grid)}] {workers} workers x {models} models", flush=True)
        if workers * models > args.max_slots:
            why = f"{workers * models:,} worker-model slots > --max-slots {args.max_slots:,} (beyond this machine)"
            progress(f"skipped: {why}")
            results["skipped"].append({"workers": workers, "models": models, "why": why})
            continue
        try:
            point = measured_point(workers, models, args, log_dir)
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
    before = BASELINE[args.quick]
    baseline = args.baseline or (before if before.is_file() and output != before else None)
    runs = ([json.loads(baseline.read_text())] if baseline else []) + [results]
    write_outputs(runs, output, output.with_suffix(""))
    print(f"took {results['seconds']:.0f} s")
    return 0 if results["points"] else 1


if __name__ == "__main__":
    sys.exit(main())
