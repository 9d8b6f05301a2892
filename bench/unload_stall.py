"""Benchmark: what one model's unload does to another model's stream on the same worker.

One worker holds two copies of the demo model (`a` and `b`). A long greedy stream runs on `b`; a
quarter of a second in, an operator unloads `a` (`POST /admin/models/a/unload`). The worker's
garbage-collector upkeep (`workers/runtime/heap_upkeep.py`) must not stall `b`'s stream while it
runs: the longest gap between `b`'s chunks after the unload is compared with the longest before it.

    .venv/bin/python bench/unload_stall.py
    .venv/bin/python bench/unload_stall.py --rounds 1   # a quick check

Each round starts its own stack (a private Redis, one worker, the front door) and stops it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from servers import run_stack

from switchboard.local.demo_model import config_entry

REPO = Path(__file__).resolve().parent.parent
# The demo model's context is 1,024 tokens: the longest answer that fits the prompt.
TOKENS = 990
UNLOAD_AFTER_S = 0.25
WARM_TRIES = 60


def body(model: str, tokens: int, *, stream: bool = False) -> dict[str, Any]:
    """A greedy chat request of exactly `tokens` tokens."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": tokens,
        "min_tokens": tokens,
        "temperature": 0,
        "stream": stream,
    }


def warm(client: httpx.Client, model: str) -> None:
    """Ask `model` until it answers (its first request may wait for its load)."""
    for _ in range(WARM_TRIES):
        if client.post("/v1/chat/completions", json=body(model, 4)).status_code == 200:
            return
        time.sleep(2)
    raise SystemExit(f"{model} never answered; see the logs under bench/results/")


def one_round(model_dir: Path, log_dir: Path, tokens: int) -> dict[str, float]:
    """Start the stack, stream on `b` while `a` unloads; the longest gaps before and after (ms)."""
    config = {
        "worker": {"max_loaded_models": 2},
        "models": [config_entry(model_dir, name=name, preload=True, keep_alive_s=3600) for name in "ab"],
    }
    with (
        run_stack(config, log_dir) as (_, server),
        httpx.Client(base_url=server.base_url, timeout=300) as client,
    ):
        for model in "ab":
            warm(client, model)
        time.sleep(3)  # the loads' own freezes are done
        unloaded_at: list[float] = []

        def unload() -> None:
            time.sleep(UNLOAD_AFTER_S)
            unloaded_at.append(time.monotonic())
            client.post("/admin/models/a/unload", json={}).raise_for_status()

        unloading = threading.Thread(target=unload)
        unloading.start()
        arrivals = []
        with client.stream("POST", "/v1/chat/completions", json=body("b", tokens, stream=True)) as response:
            response.raise_for_status()
            arrivals = [time.monotonic() for line in response.iter_lines() if line.startswith("data: ")]
        unloading.join()
    gaps = [(at, (later - at) * 1000) for at, later in itertools.pairwise(arrivals)]
    before = [gap for at, gap in gaps if at < unloaded_at[0]]
    after = [gap for at, gap in gaps if at >= unloaded_at[0]]
    if not before or not after:
        raise SystemExit("the stream ended before the unload: raise --tokens")
    return {
        "max_gap_before_ms": max(before),
        "max_gap_after_ms": max(after),
        "median_gap_after_ms": statistics.median(after),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each on a fresh stack (default 3)")
    parser.add_argument("--tokens", type=int, default=TOKENS, help=f"tokens of the stream (default {TOKENS})")
    parser.add_argument("--model-dir", type=Path, default=REPO / ".cache/bench/demo-model")
    args = parser.parse_args(argv)
    out_dir = REPO / "bench/results" / time.strftime("unload_stall-%Y%m%dT%H%M%SZ", time.gmtime())
    rounds = []
    for number in range(1, args.rounds + 1):
        print(f"[round {number}/{args.rounds}] starting a stack with two models ...", flush=True)
        found = one_round(args.model_dir, out_dir / f"round{number}", args.tokens)
        print(
            f"    longest gap between b's chunks: {found['max_gap_before_ms']:.0f} ms before a's unload, "
            f"{found['max_gap_after_ms']:.0f} ms after (median {found['median_gap_after_ms']:.1f})",
            flush=True,
        )
        rounds.append(found)
    summary = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    print(f"Medians over rounds: {json.dumps({k: round(v, 1) for k, v in summary.items()})}")
    (out_dir / "summary.json").write_text(json.dumps({"rounds": rounds, "median": summary}, indent=2))
    print(f"results: {out_dir / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
