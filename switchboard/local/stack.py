"""`switchboard up`: Redis (unless one is configured), the workers and the front door, supervised.

The terminal stays short: where the logs are, a line while it starts, a countdown while the
workers prepare their engines, a line once a first request would be answered in seconds, how to
call it. The components' own start-up output (Triton's, vLLM's) goes to their log files; what they
show here are warnings and the few records a person follows (a model loading, a worker ready).
"""

from __future__ import annotations

import contextlib
import fcntl
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from switchboard.config import DEMO_MODEL_NAME, Settings
from switchboard.local.launcher import Launcher, LauncherError
from switchboard.local.redis_server import PrivateRedis, RedisServerError
from switchboard.local.start_report import StartReport, last_start_s, remember_start_s
from switchboard.ports import is_loopback_host, local_url_host
from switchboard.private_files import NotPrivate, private_dir

DEFAULT_LOG_DIR = Path("~/.cache/switchboard/logs")
DEFAULT_PORT = 8000
READY_TIMEOUT_S = 900.0
# A worker drains running jobs for up to worker.drain_timeout_s (30 s) before it stops.
STOP_TIMEOUT_S = 90.0
SUPERVISE_EVERY_S = 0.5


def run_stack(
    settings: Settings,
    *,
    config_path: Path | None,
    log_level: str,
    workers: int = 1,
    log_dir: Path = DEFAULT_LOG_DIR,
    verbose: bool = False,
) -> int:
    """Start everything, print how to call it, and run until Ctrl-C or a component dies."""
    # Ctrl-C, SIGTERM and a closed terminal (SIGHUP) all end the wait or the supervision the same
    # way, then everything stops. (Killed outright, the children end by themselves: `with_parent`.)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.default_int_handler)
    redis = None
    launcher = None
    stack = contextlib.ExitStack()
    try:
        _build_demo_model_if_needed(settings)
        if not settings.redis.url:
            persist_dir = stack.enter_context(private_redis_dir(settings.redis.private_dir))
            redis = PrivateRedis(maxmemory=settings.redis.private_maxmemory, persist_dir=persist_dir).start()
            kept = f"; it keeps its data in {persist_dir}" if persist_dir else ""
            # Its address only: the password is for the components, which read it from a private file.
            _say(f"Redis: private redis-server at {redis.address} (stops with this command{kept})")
            _say(f"  `switchboard keys` and `models` reach it with: export REDIS_URL_FILE={redis.url_file}")
        launcher = Launcher(
            port=settings.router.port,
            host=settings.router.host,
            log_dir=Path(log_dir).expanduser(),
            workers=workers,
            config_path=config_path,
            redis_url_file=redis.url_file if redis else None,
            log_level=log_level,
            verbose=verbose,
            stop_timeout_s=STOP_TIMEOUT_S,
        )
        _say_where_logs_go(launcher)
        _say(f"Starting {_count(workers, 'worker')} and the front door ...")
        launcher.start()
        # Ready: Redis answers and a worker has Triton running and its engines' runtime imported.
        report = StartReport(last_start_s(launcher.log_dir), say=_print)
        seconds = launcher.wait_ready(READY_TIMEOUT_S, progress=report, progress_every_s=0)
        remember_start_s(launcher.log_dir, seconds)
        _say(f"Serving after {seconds:.0f} s")
        _print_examples(settings)
        return _supervise(launcher)
    except (LauncherError, RedisServerError, NotPrivate) as exc:
        print(f"switchboard: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print(flush=True)
        return 0
    finally:
        # A second Ctrl-C must not leave engines running: stopping runs to its end (it kills past a timeout).
        for sig in handlers:
            signal.signal(sig, signal.SIG_IGN)
        if launcher is not None:
            _say("Stopping ...")
            forced = launcher.stop()
            if forced:
                print(
                    f"switchboard: killed {forced} after {STOP_TIMEOUT_S:.0f} s without stopping",
                    file=sys.stderr,
                )
        if redis is not None:
            redis.stop()
        stack.close()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def private_redis_dir(configured: str) -> Iterator[str | None]:
    """The folder for the private Redis's append-only file, held for this run alone (None: keep nothing).

    Two Redis servers must never write one file: a second `switchboard up` on the same folder runs
    its Redis without keeping anything, and says so.
    """
    if not configured:
        yield None
        return
    # Only this user may read the queued prompts and keys in it (see `private_files`).
    folder = private_dir(Path(configured).expanduser())
    with open(folder / "switchboard.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(f"Redis: {folder} is in use by another `switchboard up`; this one keeps nothing")
            yield None
            return
        yield str(folder)


def _build_demo_model_if_needed(settings: Settings) -> None:
    demo = settings.model(DEMO_MODEL_NAME)
    if demo is None:
        return
    from switchboard.local.demo_model import build_demo_model, is_complete

    _say(f"Model: {DEMO_MODEL_NAME} (tiny demo model) in {demo.path}")
    if not is_complete(Path(demo.path)):
        build_demo_model(Path(demo.path), progress=lambda step: print(f"    {step}", flush=True))


def _say_where_logs_go(launcher: Launcher) -> None:
    if launcher.verbose:
        _say("Logs: everything on this terminal (--verbose)")
        return
    names = (
        ["worker.log"]
        if launcher.workers == 1
        else [f"worker-{i}.log" for i in range(1, launcher.workers + 1)]
    )
    shown = names if len(names) <= 3 else [names[0], "...", names[-1]]
    _say(f"Logs: {', '.join([*shown, 'router.log'])} in {launcher.log_dir} (--verbose shows everything here)")


def _print_examples(settings: Settings) -> None:
    host = settings.router.host
    shown_host = "localhost" if is_loopback_host(host) or host in ("0.0.0.0", "::") else local_url_host(host)
    base = f"http://{shown_host}:{settings.router.port}/v1"
    # With keys in play the examples send one; with none, the front door ignores what is sent.
    keyed = bool(settings.auth.keys or settings.auth.admin_key_sha256 or settings.auth.required)
    exposed = not is_loopback_host(host) and not settings.router.allow_open_access
    api_key = "YOUR_KEY" if keyed or exposed else "unused"
    curl_auth = f" -H 'Authorization: Bearer {api_key}'" if api_key != "unused" else ""
    # The examples chat with a generator, and embed with an embedder where one is configured.
    generators = [m.name for m in settings.models if not m.pooling]
    embedders = [m.name for m in settings.models if m.kind == "embed"]
    names = ", ".join(m.name for m in settings.models)
    preloaded = [m.name for m in settings.models if m.preload]
    models_command = "switchboard models"
    if settings.router.port != DEFAULT_PORT:
        models_command += f" --url http://127.0.0.1:{settings.router.port}"
    loading = (
        f"Models load on the first request that asks for them, so that request waits for the load "
        f"(`{models_command}` shows their state)."
    )
    if preloaded:
        loading += f" Loading now (preload = true): {', '.join(preloaded)}."
    examples = [_chat_examples(base, generators[0], curl_auth, api_key)] if generators else []
    if embedders:
        examples.append(_embedding_example(base, embedders[0], curl_auth))
    print(
        f"\nSwitchboard is serving {names} at {base}\n",
        *examples,
        f"{loading}\nPress Ctrl-C to stop.\n",
        sep="\n",
    )
    sys.stdout.flush()


def _chat_examples(base: str, model: str, curl_auth: str, api_key: str) -> str:
    return f"""Try it with curl:
  curl {base}/chat/completions -H 'Content-Type: application/json'{curl_auth} \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 32}}'

Or with the openai Python client:
  from openai import OpenAI
  client = OpenAI(base_url="{base}", api_key="{api_key}")
  for chunk in client.chat.completions.create(
      model="{model}", messages=[{{"role": "user", "content": "Hello!"}}], max_tokens=32, stream=True):
      print(chunk.choices[0].delta.content or "", end="", flush=True)
"""


def _embedding_example(base: str, model: str, curl_auth: str) -> str:
    return f"""Embed a text:
  curl {base}/embeddings -H 'Content-Type: application/json'{curl_auth} \\
    -d '{{"model": "{model}", "input": "Hello!"}}'
"""


def _supervise(launcher: Launcher) -> int:
    """Watch the components until Ctrl-C (KeyboardInterrupt) or one of them exits."""
    while True:
        launcher.check()
        time.sleep(SUPERVISE_EVERY_S)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _say(line: str) -> None:
    _print(f"• {line}")


def _print(line: str) -> None:
    print(line, flush=True)
