"""One grid point's stack for the scale benchmark: a private Redis, real front doors, fleets of
simulated workers; started together, watched, stopped, and the fleets' records read back."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from scale_fleet import FleetSpec

from switchboard import keys
from switchboard.local.launcher import probe_readiness
from switchboard.local.processes import spawn_group, stop_groups
from switchboard.local.redis_server import PrivateRedis
from switchboard.local.toml_text import toml_text
from switchboard.ports import free_port

REPO = Path(__file__).resolve().parent.parent
FLEET_SCRIPT = REPO / "bench" / "scale_fleet.py"
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 40.0
GIB = 1024**3


class StackError(RuntimeError):
    """A part of the stack did not start or exited; the message names its log."""


@dataclass(frozen=True)
class Shape:
    """What every point's stack looks like, apart from its numbers of workers and models."""

    front_doors: int
    processes: int  # OS processes that share the simulated workers (at most one per worker)
    models_per_worker: int  # models each worker may hold (0: all)
    max_loaded_models: int  # models a worker holds at once
    keep_alive_s: float
    load_s: tuple[float, float]
    token_s: float
    request_timeout_s: float


@dataclass
class Stack:
    """A running point: where to send requests, what to sample."""

    redis_url: str
    base_urls: list[str]
    front_doors: list[subprocess.Popen[bytes]]
    fleets: list[subprocess.Popen[bytes]]
    fleet_outputs: list[Path]
    log_dir: Path
    records: list[dict[str, Any]] = field(default_factory=list)

    def pids(self) -> dict[str, list[int]]:
        """The processes whose CPU time the benchmark reads, by part."""
        return {"front_doors": [p.pid for p in self.front_doors], "workers": [p.pid for p in self.fleets]}

    def check(self) -> None:
        """Raise StackError if a front door or a fleet has exited."""
        for name, processes in (("front door", self.front_doors), ("simulated workers", self.fleets)):
            for index, process in enumerate(processes):
                if process.poll() is not None:
                    raise StackError(
                        f"{name} {index + 1} exited with code {process.returncode}; logs in {self.log_dir}"
                    )


def model_names(count: int) -> list[str]:
    """The configured models, most popular first."""
    return [f"m{index:04d}" for index in range(count)]


def allowed_models(workers: int, models: int, per_worker: int) -> list[list[str]]:
    """Each worker's `worker.models`: all ([]), or `per_worker` models dealt round-robin so that
    every model has at least one worker that may hold it."""
    names = model_names(models)
    if per_worker <= 0 or per_worker >= models:
        return [[] for _ in range(workers)]
    per_worker = max(per_worker, math.ceil(models / workers))
    return [
        list(dict.fromkeys(names[(w + i * workers) % models] for i in range(per_worker)))
        for w in range(workers)
    ]


def stack_config(models: int, shape: Shape) -> dict[str, Any]:
    """The settings every part of the point reads (the product's own defaults for the rest)."""
    memory_gib = shape.max_loaded_models  # each model takes 1 GiB: the budget fits max_loaded_models
    return {
        "router": {"host": "127.0.0.1", "request_timeout_s": shape.request_timeout_s},
        "worker": {
            "kind": "scale-bench",
            "max_loaded_models": shape.max_loaded_models,
            "memory_budget_gib": memory_gib,
            "metrics_port": 0,
            "drain_timeout_s": 2.0,
        },
        "models": [
            {"name": name, "path": "unused", "keep_alive_s": shape.keep_alive_s}
            for name in model_names(models)
        ],
    }


def _child_env() -> dict[str, str]:
    """Children import the product from this checkout, whatever the environment has installed."""
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO)}


@contextlib.contextmanager
def running_stack(
    workers: int, models: int, shape: Shape, log_dir: Path, progress: Callable[[str], None]
) -> Iterator[Stack]:
    """Start Redis, the front doors and the fleets of one point; yield once all serve; stop them all.

    On leaving, the fleets' records are in `Stack.records` (one dict per fleet process).
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    config_path = log_dir / "switchboard.toml"
    config_path.write_text(toml_text(stack_config(models, shape)))
    env = _child_env()
    with PrivateRedis(maxmemory="4gb") as private_redis:
        ports = [free_port() for _ in range(shape.front_doors)]
        stack = Stack(
            redis_url=private_redis.url,
            base_urls=[f"http://127.0.0.1:{port}" for port in ports],
            front_doors=[],
            fleets=[],
            fleet_outputs=[],
            log_dir=log_dir,
        )
        try:
            for index, port in enumerate(ports):
                stack.front_doors.append(
                    _spawn_front_door(config_path, private_redis.url, port, log_dir, index, env)
                )
            _spawn_fleets(stack, workers, models, shape, config_path, env)
            _wait_until_serving(stack, workers, progress)
            yield stack
        finally:
            started = time.monotonic()
            forced = stop_groups(stack.fleets, STOP_TIMEOUT_S)
            forced += stop_groups(stack.front_doors, STOP_TIMEOUT_S)
            if forced:
                progress(f"pids {forced} ignored SIGTERM for {STOP_TIMEOUT_S:g} s; killed them")
            stack.records = [json.loads(out.read_text()) for out in stack.fleet_outputs if out.is_file()]
            progress(f"stopped in {time.monotonic() - started:.1f} s")


def _spawn_front_door(
    config: Path, redis_url: str, port: int, log_dir: Path, index: int, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "switchboard", "--log-level", "WARNING", "--config", str(config)]
    log_file = log_dir / f"front-door-{index + 1}.log"
    log_file.write_bytes(b"")  # one run per file: the front door appends
    argv += ["router", "--log-file", str(log_file)]
    child_env = {**env, "REDIS_URL": redis_url, "SWITCHBOARD_ROUTER__PORT": str(port)}
    with (log_dir / "console.log").open("ab") as console:
        return spawn_group(argv, child_env, stdout=console, cwd=REPO)


def _spawn_fleets(
    stack: Stack, workers: int, models: int, shape: Shape, config: Path, env: dict[str, str]
) -> None:
    allowed = allowed_models(workers, models, shape.models_per_worker)
    processes = max(1, min(shape.processes, workers))
    for index in range(processes):
        out = stack.log_dir / f"fleet-{index + 1}.json"
        out.unlink(missing_ok=True)
        (stack.log_dir / f"fleet-{index + 1}.log").write_bytes(b"")  # one run per file: the fleet appends
        spec = FleetSpec(
            config=str(config),
            redis_url=stack.redis_url,
            worker_models=allowed[index::processes],
            load_s=shape.load_s,
            token_s=shape.token_s,
            memory_bytes=GIB,
            out=str(out),
            log=str(stack.log_dir / f"fleet-{index + 1}.log"),
        )
        argv = [sys.executable, str(FLEET_SCRIPT), spec.to_json()]
        with (stack.log_dir / "console.log").open("ab") as console:
            stack.fleets.append(spawn_group(argv, env, stdout=console, cwd=REPO))
        stack.fleet_outputs.append(out)


def _wait_until_serving(stack: Stack, workers: int, progress: Callable[[str], None]) -> None:
    """Until every simulated worker advertises itself and every front door is ready."""
    started = time.monotonic()
    next_report = started + 10.0
    with redis.Redis.from_url(stack.redis_url) as conn:
        while True:
            stack.check()
            live = conn.zcount(keys.workers_index(), time.time() - keys.WORKER_TTL_S, "+inf")
            doors = [probe_readiness(url) for url in stack.base_urls]
            if live >= workers and all(waiting is None for waiting in doors):
                progress(
                    f"{live} workers and {len(doors)} front door(s) ready after {time.monotonic() - started:.1f} s"
                )
                return
            if time.monotonic() - started > READY_TIMEOUT_S:
                raise StackError(
                    f"not ready after {READY_TIMEOUT_S:g} s ({live}/{workers} workers); logs in {stack.log_dir}"
                )
            if time.monotonic() >= next_report:
                progress(f"waiting: {live}/{workers} workers advertised ({time.monotonic() - started:.0f} s)")
                next_report += 10.0
            time.sleep(0.2)
