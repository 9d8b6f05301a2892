"""The front door's share of the path, without an engine: time to first byte, its CPU and Redis commands per request.

Starts a private redis-server, the real front door (`switchboard router`, a process of its own, so
that its CPU time is its own), and a scripted worker in another process that takes jobs from the
model's stream with XREADGROUP, as a worker's consumer does, and answers each at once with
`--chunks` chunks through the worker's own result writer (`switchboard/lua/append_chunk.lua`, one
transaction per flush), the last one acknowledging the job. What is left is the front door's part:
request in → job on the stream, and chunk on the result stream → SSE bytes out.

The load is streamed chat completions through httpx at each concurrency level (closed loop). Per
level it reports the time to the response's first body byte (p50 and p99), the front door's CPU
per request (every thread's on-CPU time from /proc/<pid>/task/*/schedstat over the level, less
what it spends idle over as long), and the Redis commands per request (INFO commandstats; the
scripted worker's commands count too: XREADGROUP, its heartbeat, MULTI/EXEC per flush and one EVALSHA
per chunk).

`--tree DIR` (repeatable) runs the front door from other checkouts of the repository too; each
round measures every tree in turn at every level, so that machine load drifting over the run hits
them all alike, and the table shows each tree's medians over rounds. With `--profile`, py-spy
samples the front door during an extra pass at 1 and at the highest concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis
from front_door_process import (
    FrontDoorProcess,
    cpu_seconds,
    start_front_door,
    stop_front_door,
    syscalls,
    wait_ready,
)
from loadgen import percentile
from pyspy_profile import MISSING, Recording, parse_collapsed, py_spy_path, top_self_frames, without_line
from scripted_worker import MODEL, run_scripted_worker
from tables import fmt, print_aligned

from switchboard.local.redis_server import PrivateRedis

REPO = Path(__file__).resolve().parent.parent
WARMUP_REQUESTS = 20
IDLE_S = 2.0
SETTLE_S = 0.5
PROFILE_RATE = 500
# Frames whose inclusive share the profile lists: the front door's own code and what it calls most.
OWN_CODE = ("router/", "switchboard/", "litestar/", "uvicorn/", "redis/", "msgspec")


# --- the load ------------------------------------------------------------------------------------


BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me a story."}],
    "max_tokens": 64,
    "stream": True,
    "stream_options": {"include_usage": True},
}


async def one_request(client: httpx.AsyncClient, url: str) -> float:
    """Stream one chat completion to its end; seconds to the first body byte."""
    started = time.perf_counter()
    first: float | None = None
    body = b""
    async with client.stream("POST", url, json=BODY) as response:
        async for data in response.aiter_raw():
            if first is None:
                first = time.perf_counter() - started
            body += data
    if response.status_code != 200 or not body.endswith(b"data: [DONE]\n\n") or first is None:
        raise RuntimeError(f"bad answer {response.status_code}: {body[:200]!r}")
    return first


async def run_batch(client: httpx.AsyncClient, url: str, requests: int, concurrency: int) -> list[float]:
    gate = asyncio.Semaphore(concurrency)

    async def gated() -> float:
        async with gate:
            return await one_request(client, url)

    return list(await asyncio.gather(*(gated() for _ in range(requests))))


async def command_calls(redis: aioredis.Redis) -> dict[str, int]:
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(values["calls"]) for name, values in stats.items()}


@dataclass
class LevelRun:
    """One tree at one level in one round."""

    concurrency: int
    requests: int
    ttfb_p50_ms: float | None
    ttfb_p99_ms: float | None
    # Whole answers per second: a closed loop's TTFB rises with what the front door gets through.
    requests_per_s: float
    cpu_ms_per_request: float
    redis_commands_per_request: float
    syscalls_per_request: float
    commands: dict[str, float] = field(default_factory=dict)


async def idle_cpu_rate(pid: int) -> float:
    """The front door's CPU seconds per second with no requests (pollers, timers)."""
    before = cpu_seconds(pid)
    await asyncio.sleep(IDLE_S)
    return (cpu_seconds(pid) - before) / IDLE_S


async def measure_level(
    front_door: FrontDoorProcess, redis: aioredis.Redis, concurrency: int, requests: int, idle_rate: float
) -> LevelRun:
    url = f"{front_door.base_url}/v1/chat/completions"
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        await run_batch(client, url, max(WARMUP_REQUESTS, concurrency), concurrency)
        await asyncio.sleep(SETTLE_S)
        calls_before = await command_calls(redis)
        syscalls_before = syscalls(front_door.process.pid)
        cpu_before, started = cpu_seconds(front_door.process.pid), time.perf_counter()
        ttfbs = await run_batch(client, url, requests, concurrency)
        wall_s = time.perf_counter() - started
        cpu_s = cpu_seconds(front_door.process.pid) - cpu_before - idle_rate * wall_s
        syscalls_made = syscalls(front_door.process.pid) - syscalls_before
        calls_after = await command_calls(redis)
    # The two INFO calls themselves are left out.
    calls = {
        name: (count - calls_before.get(name, 0) - (2 if name == "info" else 0)) / requests
        for name, count in calls_after.items()
    }
    calls = {name: round(per, 2) for name, per in calls.items() if per > 0.005}
    ttfbs_ms = sorted(t * 1000 for t in ttfbs)
    return LevelRun(
        concurrency=concurrency,
        requests=requests,
        ttfb_p50_ms=percentile(ttfbs_ms, 50),
        ttfb_p99_ms=percentile(ttfbs_ms, 99),
        requests_per_s=round(requests / wall_s, 1),
        cpu_ms_per_request=round(cpu_s * 1000 / requests, 3),
        redis_commands_per_request=round(sum(calls.values()), 2),
        syscalls_per_request=round(syscalls_made / requests, 2),
        commands=dict(sorted(calls.items(), key=lambda item: -item[1])),
    )


async def profile_level(
    front_door: FrontDoorProcess, concurrency: int, requests: int, py_spy: str, out_dir: Path
) -> dict[str, Any]:
    """The functions that spend the most themselves in the front door during a pass at `concurrency`."""
    output = out_dir / f"front-door-{front_door.label}-c{concurrency}.txt"
    recording = Recording(py_spy, front_door.process.pid, output, PROFILE_RATE, native=False)
    url = f"{front_door.base_url}/v1/chat/completions"
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        await asyncio.sleep(0.5)  # py-spy attaches
        await run_batch(client, url, requests, concurrency)
    if (problem := recording.stop()) is not None:
        return {"error": problem}
    text = output.read_text()
    return {
        "self": [asdict(frame) for frame in top_self_frames(text, 25)],
        "inclusive": inclusive_frames(text, 40),
    }


def inclusive_frames(text: str, count: int) -> list[dict[str, Any]]:
    """The functions of `OWN_CODE` on the stack (anywhere, once per sample) in the most samples."""
    on_stack: dict[str, int] = {}
    total = 0
    for frames, samples in parse_collapsed(text):
        total += samples
        for frame in {without_line(frame) for frame in frames}:
            if any(part in frame for part in OWN_CODE):
                on_stack[frame] = on_stack.get(frame, 0) + samples
    ranked = sorted(on_stack.items(), key=lambda item: -item[1])[:count]
    return [{"frame": frame, "samples": n, "share": round(n / max(total, 1), 4)} for frame, n in ranked]


# --- the run -------------------------------------------------------------------------------------


def requests_at(args: argparse.Namespace, concurrency: int) -> int:
    return int(max(args.requests, args.requests_per_stream * concurrency))


async def run(args: argparse.Namespace, trees: list[tuple[str, Path]]) -> dict[str, Any]:
    out_dir = args.output.parent / args.output.stem
    out_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[LevelRun]] = {label: [] for label, _ in trees}
    profiles: dict[str, dict[int, Any]] = {}
    with PrivateRedis() as private:
        redis = aioredis.Redis.from_url(private.url)
        worker = multiprocessing.get_context("spawn").Process(
            target=run_scripted_worker, args=(private.url, args.chunks, args.tokens), daemon=True
        )
        worker.start()
        try:
            for round_no in range(1, args.rounds + 1):
                for label, tree in trees:
                    await measure_tree(args, label, tree, private.url, redis, out_dir, runs[label], round_no)
            if args.profile:
                profiles = await profile_trees(args, trees, private.url, out_dir)
        finally:
            worker.terminate()
            worker.join()
            await redis.aclose()
    return {"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs, "profiles": profiles}


async def measure_tree(
    args: argparse.Namespace,
    label: str,
    tree: Path,
    redis_url: str,
    redis: aioredis.Redis,
    out_dir: Path,
    into: list[LevelRun],
    round_no: int,
) -> None:
    front_door = start_front_door(tree, label, redis_url, out_dir)
    try:
        async with httpx.AsyncClient() as client:
            await wait_ready(front_door, client)
        idle_rate = await idle_cpu_rate(front_door.process.pid)
        for concurrency in args.concurrency:
            level = await measure_level(
                front_door, redis, concurrency, requests_at(args, concurrency), idle_rate
            )
            into.append(level)
            print(
                f"round {round_no} {label:>8} c={concurrency:<3} ttfb p50 {fmt(level.ttfb_p50_ms, 2)} ms "
                f"p99 {fmt(level.ttfb_p99_ms, 2)} ms, {level.requests_per_s} req/s, "
                f"cpu {level.cpu_ms_per_request:.3f} ms/req, "
                f"redis {level.redis_commands_per_request} cmd/req, {level.syscalls_per_request} syscalls/req",
                flush=True,
            )
    finally:
        stop_front_door(front_door)


async def profile_trees(
    args: argparse.Namespace, trees: list[tuple[str, Path]], redis_url: str, out_dir: Path
) -> dict[str, dict[int, Any]]:
    py_spy = py_spy_path()
    if py_spy is None:
        print(MISSING, flush=True)
        return {}
    profiles: dict[str, dict[int, Any]] = {}
    for label, tree in trees:
        front_door = start_front_door(tree, label, redis_url, out_dir)
        try:
            async with httpx.AsyncClient() as client:
                await wait_ready(front_door, client)
            profiles[label] = {}
            for concurrency in sorted({1, max(args.concurrency)}):
                requests = requests_at(args, concurrency)
                profiles[label][concurrency] = await profile_level(
                    front_door, concurrency, requests, py_spy, out_dir
                )
        finally:
            stop_front_door(front_door)
    return profiles


def median(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def print_table(runs: dict[str, list[LevelRun]], levels: list[int]) -> None:
    lines = [
        [
            "tree",
            "streams",
            "TTFB p50 ms",
            "TTFB p99 ms",
            "req/s",
            "CPU ms/req",
            "Redis cmd/req",
            "syscalls/req",
        ]
    ]
    for label, level_runs in runs.items():
        for concurrency in levels:
            at = [run for run in level_runs if run.concurrency == concurrency]
            lines.append(
                [
                    label,
                    str(concurrency),
                    fmt(median([run.ttfb_p50_ms for run in at]), 2),
                    fmt(median([run.ttfb_p99_ms for run in at]), 2),
                    fmt(median([run.requests_per_s for run in at]), 1),
                    fmt(median([run.cpu_ms_per_request for run in at]), 3),
                    fmt(median([run.redis_commands_per_request for run in at]), 2),
                    fmt(median([run.syscalls_per_request for run in at]), 1),
                ]
            )
    print_aligned(lines)


def print_profiles(profiles: dict[str, dict[int, Any]], count: int) -> None:
    for label, by_level in profiles.items():
        for concurrency, profile in by_level.items():
            print(f"\nfront door ({label}), {concurrency} streams:")
            if "error" in profile:
                print(f"  {profile['error']}")
                continue
            for kind, title in (
                ("self", "spending the most themselves"),
                ("inclusive", "on the stack the most"),
            ):
                print(f"  the functions {title}:")
                for frame in profile[kind][:count]:
                    print(f"  {frame['share'] * 100:5.1f}%  {frame['frame']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,8,32", help="levels, comma-separated (default 1,8,32)")
    parser.add_argument("--requests", type=int, default=200, help="requests per level at least (default 200)")
    parser.add_argument(
        "--requests-per-stream", type=int, default=20, help="requests per stream of a level (default 20)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the table shows medians (default 3)")
    parser.add_argument("--chunks", type=int, default=8, help="chunks per answer (default 8)")
    parser.add_argument("--tokens", type=int, default=64, help="completion tokens per answer (default 64)")
    parser.add_argument("--tree", action="append", default=[], help="another checkout to measure too")
    parser.add_argument("--profile", action="store_true", help="py-spy profiles at 1 and the highest level")
    parser.add_argument(
        "--output",
        type=Path,
        default=REPO / f"bench/results/front_door_path-{stamp}.json",
        help="the run's JSON (default bench/results/front_door_path-<UTC time>.json)",
    )
    args = parser.parse_args(argv)
    args.concurrency = [int(level) for level in args.concurrency.split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    trees = [("this", REPO), *((Path(tree).name, Path(tree).resolve()) for tree in args.tree)]
    result = asyncio.run(run(args, trees))
    print()
    print_table(result["runs"], args.concurrency)
    print_profiles(result["profiles"], 30)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    runs = {label: [asdict(run) for run in level_runs] for label, level_runs in result["runs"].items()}
    args.output.write_text(json.dumps({**result, "runs": runs}, indent=2))
    print(f"\nwritten to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
