"""What one hop between two processes costs on this machine, hot and after the processes slept.

Every hop of a request between processes (the front door to Redis, Redis to the worker, the worker
to tritonserver, ...) wakes a process that was waiting. Back to back, a wake is cheap; after a few
milliseconds asleep (what every process of the path does at one stream while the engine computes)
it costs more: the core was idle, and the woken process's first microseconds of work run slower.
This prints those costs, so that a path's floor can be counted in hops:

- **work after sleeping**: the same small piece of Python work (a 2,000-step loop), timed right
  after the previous one and after sleeping 5 or 20 ms;
- **socket round trip**: a one-byte ping and its echo between two processes over a Unix socket,
  both on one core and on two cores, back to back and after the client slept;
- **Redis PING**: the same through redis-py and a private redis-server, one core and two.

    .venv/bin/python bench/wake_cost.py
    .venv/bin/python bench/wake_cost.py --samples 1000 --gaps-ms 0,1,5,20

Medians and 90th percentiles in microseconds; the JSON goes to bench/results/wake_cost-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from switchboard.local.redis_server import PrivateRedis

REPO = Path(__file__).resolve().parent.parent
LOOP_STEPS = 2_000


def small_work() -> int:
    """A fixed piece of pure Python work (about 70 µs on a hot core here)."""
    total = 0
    for step in range(LOOP_STEPS):
        total += step * step
    return total


def timed_after_gaps(action: Callable[[], object], gaps_ms: list[float], samples: int) -> dict[str, Any]:
    """`action`'s duration in µs (median and 90th percentile) after sleeping each gap first."""
    action()
    results = {}
    for gap_ms in gaps_ms:
        durations = []
        for _ in range(samples):
            if gap_ms:
                time.sleep(gap_ms / 1000)
            start = time.perf_counter()
            action()
            durations.append((time.perf_counter() - start) * 1e6)
        durations.sort()
        results[f"{gap_ms:g}"] = {
            "p50_us": round(statistics.median(durations), 1),
            "p90_us": round(durations[int(len(durations) * 0.9)], 1),
        }
    return results


def echo_server(path: str, core: int | None) -> None:
    """Answer every byte received on the Unix socket at `path` with the same byte, until closed."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen()
    connection, _ = listener.accept()
    while data := connection.recv(64):
        connection.sendall(data)


@contextmanager
def pinned(core: int | None) -> Iterator[None]:
    """This process (and what it starts meanwhile) on `core` alone; all its cores again after."""
    cores = os.sched_getaffinity(0)
    if core is not None:
        os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, cores)


def socket_round_trips(server_core: int | None, gaps_ms: list[float], samples: int) -> dict[str, Any]:
    """Echo round trips to a process on `server_core`, timed from this one."""
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "echo.sock")
        server = multiprocessing.get_context("spawn").Process(target=echo_server, args=(path, server_core))
        server.start()
        while not os.path.exists(path):
            time.sleep(0.01)
        client = socket.socket(socket.AF_UNIX)
        client.connect(path)

        def ping() -> None:
            client.sendall(b"x")
            client.recv(64)

        try:
            return timed_after_gaps(ping, gaps_ms, samples)
        finally:
            client.close()
            server.join(timeout=5)


def redis_round_trips(server_core: int | None, gaps_ms: list[float], samples: int) -> dict[str, Any]:
    """redis-py PINGs to a private redis-server on `server_core`."""
    private = PrivateRedis()
    with pinned(server_core):
        private.start()  # the server keeps the affinity it started with
    try:
        with redis.Redis.from_url(private.url) as client:
            return timed_after_gaps(client.ping, gaps_ms, samples)
    finally:
        private.stop()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement, with this process on the first core and servers on it or the next."""
    cores = sorted(os.sched_getaffinity(0))
    client_core = cores[0]
    placements = {"one core": client_core, "two cores": cores[1] if len(cores) > 1 else None}
    results: dict[str, Any] = {"cores": cores}
    with pinned(client_core):
        print("work after sleeping ...", flush=True)
        results["work after sleeping"] = timed_after_gaps(small_work, args.gaps_ms, args.samples)
        for placement, server_core in placements.items():
            if server_core is None:
                continue
            print(f"socket round trip, {placement} ...", flush=True)
            results[f"socket round trip, {placement}"] = socket_round_trips(
                server_core, args.gaps_ms, args.samples
            )
            print(f"Redis PING, {placement} ...", flush=True)
            results[f"Redis PING, {placement}"] = redis_round_trips(server_core, args.gaps_ms, args.samples)
    return results


def print_table(results: dict[str, Any], gaps_ms: list[float]) -> None:
    """One row per measurement, one column per gap: median / 90th percentile in µs."""
    header = ["measurement"] + [f"after {gap:g} ms asleep" if gap else "back to back" for gap in gaps_ms]
    print("\n| " + " | ".join(header) + " |")
    print("|---" * len(header) + "|")
    for name, by_gap in results.items():
        if name == "cores":
            continue
        cells = [
            f"{by_gap[f'{gap:g}']['p50_us']:.0f} / {by_gap[f'{gap:g}']['p90_us']:.0f}" for gap in gaps_ms
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\nµs, median / 90th percentile.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line settings."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--samples", type=int, default=300, help="timings per gap (default 300)")
    parser.add_argument(
        "--gaps-ms",
        type=lambda text: [float(part) for part in text.split(",")],
        default=[0.0, 5.0, 20.0],
        help="sleeps before each timing, in ms (default 0,5,20)",
    )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    parser.add_argument(
        "--output",
        type=Path,
        default=REPO / f"bench/results/wake_cost-{stamp}.json",
        help="JSON results file (default under bench/results/)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table and write the JSON; returns the exit code."""
    args = parse_args(argv)
    results = measure(args)
    print_table(results, args.gaps_ms)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps({"settings": {"samples": args.samples, "gaps_ms": args.gaps_ms}, **results})
    )
    print(f"results: {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
