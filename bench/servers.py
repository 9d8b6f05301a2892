"""Start and stop the systems the benchmarks compare, on this machine, on free ports."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from switchboard.config import WorkerConfig
from switchboard.local.demo_model import config_entry
from switchboard.local.launcher import Launcher, LauncherError
from switchboard.local.processes import spawn_group, stop_groups
from switchboard.local.redis_server import PrivateRedis
from switchboard.local.toml_text import toml_text
from switchboard.ports import free_port
from workers.runtime.cpu_placement import available_cores, compute_cores, engine_threads_bind

REPO = Path(__file__).resolve().parent.parent
MODEL_NAME = "switchboard-demo"
# What LiteLLM's proxy imports beyond litellm: pyproject.toml's `bench` group, not `make install`'s.
LITELLM_PROXY_MODULES = ("apscheduler", "backoff", "expression", "fastapi_sso", "semver", "soundfile")
READY_TIMEOUT_S = 600.0
PROGRESS_EVERY_S = 10.0
STOP_TIMEOUT_S = 30.0


class StartupError(RuntimeError):
    """A server did not become ready; the message names its log files."""


@dataclass
class Server:
    """A running system, ready to take requests."""

    base_url: str
    start_s: float
    redis_url: str | None = None
    # The key its clients send (LiteLLM's proxy refuses to start without one; the others take any).
    api_key: str = "unused"


# --- load generation -------------------------------------------------------------------------------


def engine_cores() -> str:
    """The cores a Switchboard worker gives its only engine; vLLM's server gets the same, for fairness."""
    cores = compute_cores(available_cores(), WorkerConfig().reserved_cores)
    return engine_threads_bind(cores, 0, 1)


def spawn(argv: list[str], env: dict[str, str], log: TextIO) -> subprocess.Popen[bytes]:
    """Start a server in its own process group, so that its engine children can be stopped with it."""
    return spawn_group(argv, env, stdout=log, cwd=REPO)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after a while, with any child it left behind in its group."""
    if stop_groups([process], timeout_s=STOP_TIMEOUT_S):
        print(f"    pid {process.pid} ignored SIGTERM for {STOP_TIMEOUT_S:g} s; killed it", flush=True)


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


# The same engine settings as the Switchboard worker gives the demo model.
DEMO_ENGINE_FLAGS = ("--max-model-len", "1024", "--dtype", "float32", "--enforce-eager")


@contextlib.contextmanager
def spawn_vllm(
    model_dir: Path,
    log_path: Path,
    stream_interval: int = 1,
    *,
    served_name: str = MODEL_NAME,
    engine_flags: Sequence[str] = DEMO_ENGINE_FLAGS,
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """vLLM's own OpenAI server on the demo model, just spawned (not yet answering), and its base URL.

    `stream_interval`: vLLM's `--stream-interval`, tokens per streamed chunk (its default is 1).
    `served_name` and `engine_flags`: another model's name and engine settings (a pooling model's).
    """
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": engine_cores()}
    flags = [*engine_flags, "--host", "127.0.0.1"]
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    argv += ["--served-model-name", served_name, "--port", str(port), *flags]
    if stream_interval > 1:
        argv += ["--stream-interval", str(stream_interval)]
    with log_path.open("w") as log:
        process = spawn(argv, env, log)
        try:
            yield process, f"http://127.0.0.1:{port}"
        finally:
            stop(process)


@contextlib.contextmanager
def run_vllm(model_dir: Path, log_dir: Path, round_no: int, stream_interval: int = 1) -> Iterator[Server]:
    """vLLM's own OpenAI server on the demo model, ready (`stream_interval`: see `spawn_vllm`)."""
    suffix = "" if stream_interval == 1 else f"-si{stream_interval}"
    log_path = log_dir / f"vllm{suffix}-round{round_no}.log"
    with spawn_vllm(model_dir, log_path, stream_interval) as (process, base_url):
        start_s = wait_ready(f"{base_url}/v1/models", [process], [log_path], "vllm")
        yield Server(base_url, start_s)


def litellm_proxy_missing() -> list[str]:
    """The modules LiteLLM's proxy needs that this environment lacks (none after `make install-bench`)."""
    return [name for name in LITELLM_PROXY_MODULES if importlib.util.find_spec(name) is None]


def litellm_config(vllm_base_url: str, master_key: str) -> dict[str, Any]:
    """LiteLLM's proxy config: the demo model's name routed to vLLM's server as an OpenAI-compatible
    backend, and nothing else (no database, callbacks or retries; a failed request counts as one)."""
    backend = {"model": f"openai/{MODEL_NAME}", "api_base": f"{vllm_base_url}/v1", "api_key": "unused"}
    return {
        "model_list": [{"model_name": MODEL_NAME, "litellm_params": backend}],
        "litellm_settings": {"callbacks": [], "success_callback": [], "failure_callback": []},
        "router_settings": {"num_retries": 0},
        "general_settings": {"master_key": master_key},
    }


@contextlib.contextmanager
def spawn_litellm(
    vllm_base_url: str, log_dir: Path, round_no: int
) -> Iterator[tuple[subprocess.Popen[bytes], str, str]]:
    """LiteLLM's proxy (one worker) in front of vLLM's server at `vllm_base_url`, just spawned: the
    process, its base URL and the master key its clients send."""
    port, master_key = free_port(), f"sk-bench-{secrets.token_hex(16)}"
    config_path = log_dir / f"litellm-round{round_no}.yaml"
    config_path.write_text(json.dumps(litellm_config(vllm_base_url, master_key), indent=2))  # JSON is YAML
    # LITELLM_LOCAL_MODEL_COST_MAP: the cost map that ships with litellm, instead of fetching it at
    # start; LITELLM_LOG=ERROR: no access log line or info line per request.
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    env.pop("DATABASE_URL", None)
    argv = [sys.executable, "-m", "litellm.proxy.proxy_cli", "--config", str(config_path)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    with (log_dir / f"litellm-round{round_no}.log").open("w") as log:
        process = spawn(argv, env, log)
        try:
            yield process, f"http://127.0.0.1:{port}", master_key
        finally:
            stop(process)


@contextlib.contextmanager
def run_litellm(model_dir: Path, log_dir: Path, round_no: int) -> Iterator[Server]:
    """LiteLLM's proxy in front of vLLM's own server (default stream interval), both ready: what a
    user would put in front of vLLM instead of Switchboard. The clients call the proxy."""
    logs = [log_dir / f"litellm-vllm-round{round_no}.log", log_dir / f"litellm-round{round_no}.log"]
    started = time.monotonic()
    with (
        spawn_vllm(model_dir, logs[0]) as (engine, vllm_url),
        spawn_litellm(vllm_url, log_dir, round_no) as (proxy, proxy_url, master_key),
    ):
        wait_ready(f"{vllm_url}/v1/models", [engine, proxy], logs, "litellm's vllm")
        wait_ready(f"{proxy_url}/health/readiness", [engine, proxy], logs, "litellm")
        yield Server(proxy_url, time.monotonic() - started, api_key=master_key)


@contextlib.contextmanager
def run_switchboard(
    model_dir: Path, log_dir: Path, round_no: int, env: dict[str, str] | None = None
) -> Iterator[Server]:
    """A private Redis, one Switchboard worker with the demo model preloaded, and the front door.

    Ready means the model answered a first request, as vLLM's server is ready once its model is loaded.
    `env`: added to every component's environment (say, `SWITCHBOARD_TRACE_FILE` for a traced run).
    """
    round_dir = log_dir / f"switchboard-round{round_no}"  # worker.log, router.log, console.log
    config = {"models": [config_entry(model_dir, name=MODEL_NAME, preload=True)]}
    with run_stack(config, round_dir, env) as (launcher, server):
        try:
            warm_s = launcher.wait_serving(MODEL_NAME, READY_TIMEOUT_S, _progress, PROGRESS_EVERY_S)
        except LauncherError as exc:
            raise StartupError(f"switchboard: {exc}") from exc
        yield Server(server.base_url, server.start_s + warm_s, server.redis_url)


@contextlib.contextmanager
def run_stack(
    config: dict[str, Any], log_dir: Path, env: dict[str, str] | None = None
) -> Iterator[tuple[Launcher, Server]]:
    """A private Redis, one worker and the front door serving `config`, once `/readyz` passes.

    Nothing need be loaded then: `Server.start_s` is the time from starting the stack to ready. The
    logs (worker.log, router.log, console.log) and the config file go to `log_dir`.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    config_path = log_dir / "switchboard.toml"
    config_path.write_text(toml_text(config))
    with PrivateRedis() as redis:
        launcher = Launcher(
            port=free_port(),
            log_dir=log_dir,
            config_path=config_path,
            redis_url=redis.url,
            console=log_dir / "console.log",
            cwd=REPO,
            env={**os.environ, **(env or {})},
            stop_timeout_s=STOP_TIMEOUT_S,
        )
        try:
            started = time.monotonic()
            try:
                launcher.start()
                launcher.wait_ready(READY_TIMEOUT_S, _progress, PROGRESS_EVERY_S)
            except LauncherError as exc:
                raise StartupError(f"switchboard: {exc}") from exc
            yield launcher, Server(launcher.base_url, time.monotonic() - started, redis.url)
        finally:
            # The front door first, so that nothing new reaches the worker while it drains.
            forced = launcher.stop()
            if forced:
                print(f"    pids {forced} ignored SIGTERM for {STOP_TIMEOUT_S:g} s; killed them", flush=True)


def _progress(elapsed_s: float, waiting_for: str) -> None:
    print(f"    switchboard: {waiting_for} ({elapsed_s:.0f} s)", flush=True)


# --- the benchmark ---------------------------------------------------------------------------------


BENCH_REPO = Path(__file__).resolve().parent.parent


def add_model_and_output_args(parser: argparse.ArgumentParser, bench: str) -> None:
    """`--model-dir` (the demo model's cache, shared by every benchmark) and `--output` (this run's
    JSON, named after `bench` and the time, under bench/results/)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=BENCH_REPO / ".cache/bench/demo-model",
        help="demo model cache (default .cache/bench/demo-model)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=BENCH_REPO / f"bench/results/{bench}-{stamp}.json",
        help="JSON results file (default under bench/results/)",
    )
