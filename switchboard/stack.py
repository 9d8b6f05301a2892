"""`switchboard up`: Redis (unless one is configured), one worker and the front door, supervised."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from switchboard.config import DEMO_MODEL_NAME, Settings
from switchboard.processes import spawn_group, stop_groups
from switchboard.readiness import WAITING_FOR
from switchboard.redis_server import PrivateRedis, RedisServerError

READY_TIMEOUT_S = 900.0
# A worker drains running jobs for up to worker.drain_timeout_s (30 s) before it stops.
STOP_TIMEOUT_S = 90.0

PROGRESS_EVERY_S = 10.0


def run_stack(settings: Settings, *, config_path: Path | None, log_level: str) -> int:
    """Start everything, print how to call it, and run until Ctrl-C or a component dies."""
    _build_demo_model_if_needed(settings)
    redis = None
    if not settings.redis.url:
        try:
            redis = PrivateRedis().start()
        except RedisServerError as exc:
            print(f"switchboard: {exc}", file=sys.stderr)
            return 1
        print(f"• Redis: private redis-server at {redis.url} (stops with this command)")
    env = _child_environment(settings, redis)
    children: list[subprocess.Popen[bytes]] = []
    try:
        children.append(_spawn("worker", config_path, log_level, env))
        children.append(_spawn("router", config_path, log_level, env))
        if not _wait_until_ready(settings, children):
            return 1
        _print_examples(settings)
        return _supervise(children)
    finally:
        _stop_all(children)
        if redis is not None:
            redis.stop()


def _build_demo_model_if_needed(settings: Settings) -> None:
    demo = settings.model(DEMO_MODEL_NAME)
    if demo is None:
        return
    from switchboard.demo_model import build_demo_model

    print(f"• Model: {DEMO_MODEL_NAME} (tiny demo model) in {demo.path}")
    build_demo_model(Path(demo.path), progress=lambda step: print(f"    {step}", flush=True))


def _child_environment(settings: Settings, redis: PrivateRedis | None) -> dict[str, str]:
    env = dict(os.environ)
    if redis is not None:
        env["REDIS_URL"] = redis.url
    env["SWITCHBOARD_ROUTER__PORT"] = str(settings.router.port)
    return env


def _spawn(
    command: str, config_path: Path | None, log_level: str, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "switchboard", "--log-level", log_level]
    if config_path is not None:
        argv += ["--config", str(config_path)]
    return spawn_group([*argv, command], env)


def _wait_until_ready(settings: Settings, children: list[subprocess.Popen[bytes]]) -> bool:
    """Poll /readyz, showing progress, until the stack serves or a component exits."""
    url = f"http://127.0.0.1:{settings.router.port}/readyz"
    started = time.monotonic()
    next_report = started + PROGRESS_EVERY_S
    print("• Starting the worker (Triton and the engine) and the front door ...", flush=True)
    while time.monotonic() - started < READY_TIMEOUT_S:
        for child in children:
            if child.poll() is not None:
                print(
                    f"switchboard: {_name(child)} exited with code {child.returncode}; see its log above.",
                    file=sys.stderr,
                )
                return False
        status = _readiness(url)
        if status == "ready":
            print(f"• Ready after {time.monotonic() - started:.0f} s", flush=True)
            return True
        if time.monotonic() >= next_report:
            print(f"  ... still starting ({time.monotonic() - started:.0f} s; {status})", flush=True)
            next_report += PROGRESS_EVERY_S
        time.sleep(0.5)
    print(f"switchboard: not ready after {READY_TIMEOUT_S:.0f} s; see the logs above.", file=sys.stderr)
    return False


def _readiness(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return str(json.loads(response.read()).get("status", "ready"))
    except urllib.error.HTTPError as exc:
        try:
            error = json.loads(exc.read())["error"]
        except (ValueError, KeyError):
            return f"front door answered {exc.code}"
        return WAITING_FOR.get(error.get("code"), str(error.get("message")))
    except (urllib.error.URLError, OSError):
        return "front door not listening yet"


def _print_examples(settings: Settings) -> None:
    base = f"http://localhost:{settings.router.port}/v1"
    model = settings.models[0].name
    print(
        f"""
Switchboard is serving {", ".join(m.name for m in settings.models)} at {base}

Try it with curl:
  curl {base}/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 32}}'

Or with the openai Python client:
  from openai import OpenAI
  client = OpenAI(base_url="{base}", api_key="unused")
  for chunk in client.chat.completions.create(
      model="{model}", messages=[{{"role": "user", "content": "Hello!"}}], max_tokens=32, stream=True):
      print(chunk.choices[0].delta.content or "", end="", flush=True)

Press Ctrl-C to stop.
""",
        flush=True,
    )


def _supervise(children: list[subprocess.Popen[bytes]]) -> int:
    stop = {"requested": False}

    def request_stop(*_: object) -> None:
        stop["requested"] = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    while not stop["requested"]:
        for child in children:
            if child.poll() is not None:
                print(
                    f"switchboard: {_name(child)} exited with code {child.returncode}; stopping.",
                    file=sys.stderr,
                )
                return 1
        time.sleep(0.5)
    print("\n• Stopping ...", flush=True)
    return 0


def _stop_all(children: list[subprocess.Popen[bytes]]) -> None:
    # The front door first, so no new work arrives while the worker drains.
    forced = stop_groups(list(reversed(children)), timeout_s=STOP_TIMEOUT_S)
    if forced:
        print(f"switchboard: killed {forced} after {STOP_TIMEOUT_S:.0f} s without stopping", file=sys.stderr)


def _name(child: subprocess.Popen[bytes]) -> str:
    return str(child.args[-1]) if isinstance(child.args, list) else "a component"
