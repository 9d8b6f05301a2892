"""The real stack for end-to-end tests: Redis, workers (PyTriton + vLLM) and the front door, all processes.

Two ways in (fixtures of tests/e2e/conftest.py), both started by `switchboard.local.launcher.Launcher`
like `switchboard up`:

- `stack` (with `client` and `async_client`): one worker and the demo model, marked `preload = true`
  and answered once before the first test, started once for this folder and shared, because an
  engine takes a while to start;
- `start_stack(config, *, workers=1, env=None, worker_env=(), ready_timeout_s=...)`, a fixture that
  returns a context manager (`running_stack` without the fixture): its own private Redis, `workers`
  worker processes and the front door, from a TOML text or a settings dict, with logs in a temp
  folder. It yields a `Stack`: `base_url`, `redis_url`, `log_dir`, `log_paths`, `console_log` (what
  `switchboard up` would have shown on its terminal), `workers` (each a `Component`: `.process`,
  `.log_path`, `.kill()` to lose one with everything it started), `spawn_worker()`, `wait_serving()`
  and `wait_until()`. Everything stops on leaving the block; a component that ignores SIGTERM fails
  the test. When the block raises, or a test of the session has failed, the ends of the logs are
  printed.

  With `persist_redis=True` the private Redis keeps an append-only file in `<root>/redis`, as
  `switchboard up`'s does: `stack.stop_redis(signal)` stops it (SIGTERM, or SIGKILL for a crash)
  and `stack.start_redis()` starts it again on the same port and directory
  (`start_redis(keep_files=False)`: empty, as a Redis without persistence comes back).
  Start processes (`start_redis`, `spawn_worker`, `spawn_front_door`) from a thread that lives as
  long as they should: each is started through `switchboard.with_parent`, whose parent-death
  signal (PR_SET_PDEATHSIG) is sent when the *thread* that started it ends, so one started from
  `asyncio.to_thread` gets SIGTERM once that executor thread exits.
  With `redis=URL` the stack uses that Redis instead of a private one (a Sentinel URL of
  tests/support/sentinel.py's topology, say), which the test started and stops itself;
  `stop_redis` and `start_redis` are then refused.
  `stack.spawn_front_door()` starts one more front door (a `FrontDoor`: its `base_url` and
  `component`) on another port, sharing the stack's Redis and config; it stops with the rest.
  `spawn_front_door(env={"SWITCHBOARD_ROUTER__REQUEST_TIMEOUT_S": "1.5"})` gives that one other
  settings (environment overrides the config file), so a test can share a stack it would otherwise
  start for one front-door setting; `stack.stop_front_door(front_door)` stops it before the rest.

A test on several workers (for example in tests/e2e/test_serverless.py)::

    pytestmark = pytest.mark.e2e

    def test_jobs_of_a_lost_worker_are_taken_over(start_stack, demo_model_dir: Path) -> None:
        config = {
            "worker": {"max_loaded_models": 1},
            "models": [config_entry(demo_model_dir, name="a", keep_alive_s=5), config_entry(demo_model_dir, name="b")],
        }
        with start_stack(config, workers=2, env={"SWITCHBOARD_WORKER__HEARTBEAT_S": "0.5"}) as stack:
            stack.wait_serving("a", timeout_s=STACK_TIMEOUT_S)   # the first request loads it
            stack.workers[0].kill()                             # SIGKILL to its whole process group
            client = redis.Redis.from_url(stack.redis_url)
            stack.wait_until(lambda: ..., timeout_s=60, what="the job to be taken over")

`config_entry` is `switchboard.local.demo_model.config_entry`: a `[[models]]` entry serving the demo
model from a folder (the same engine arguments as `switchboard up`), with any field overridden.
Never sleep a fixed time: wait for what the test needs with `wait_serving` or `wait_until`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis as redis_client

from switchboard.config import DEMO_MODEL_NAME
from switchboard.local.launcher import SWITCHBOARD_ARGV, Component, Launcher, LauncherError, probe_readiness
from switchboard.local.processes import spawn_group, stop_groups
from switchboard.local.redis_server import PrivateRedis
from switchboard.local.toml_text import toml_text
from switchboard.logs import LOG_LABEL_ENV
from switchboard.ports import free_port

MODEL = DEMO_MODEL_NAME
# The shared e2e stack's route over the demo model (its stable version) and two other versions:
# one with other weights, which answers differently, and one that cannot load.
ROUTE = "tiny-chat"
SECOND_VERSION = "tiny-v2"
BROKEN_VERSION = "tiny-broken"
SECOND_VERSION_SEED = 2
# ... and its pipeline of fallbacks: the version that cannot load, then the demo model.
PIPELINE = "tiny-resilient"
# A version nobody loads unless a test chooses it: a router's cold target.
COLD_VERSION = "tiny-v3"
# Router pipelines over the demo model (label "A") and another version (label "B"), each router's
# choice steered to "B" by a logit bias: one whose "B" is the second version; one whose "B" is the
# cold version, any warm target winning over it; one whose router cannot load.
ROUTER_PIPELINE = "tiny-router"
WARM_ROUTER_PIPELINE = "tiny-router-warm"
BROKEN_ROUTER_PIPELINE = "tiny-router-broken"
# A cascade: the demo model drafts, the second version answers what the draft is unsure of.
CASCADE_PIPELINE = "tiny-cascade"
# Between the demo model's greedy answers' mean token log-probability (about -1.8) and that of its
# answers sampled at temperature 2 (about -6).
CASCADE_MIN_MEAN_LOGPROB = -3.5
# A version only tests/e2e/test_observability.py loads (its first request waits for the load), with
# every process of the shared stack exporting its spans to SPANS_FILE in the stack's folder.
TRACED_VERSION = "tiny-traced"
SPANS_FILE = "spans.jsonl"
# The deadline of tests/e2e/conftest.py's `two_workers` stack (the soak's and the stream takeover's):
# further than any request there may take, so that a request left waiting for it shows as hung.
TWO_WORKERS_REQUEST_TIMEOUT_S = 240
# Generous: a busy machine took over two minutes to start one vLLM CPU engine.
STACK_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 60.0
LOG_TAIL_LINES = 40
# Settings every test stack gets unless its config says otherwise.
TEST_DEFAULTS: dict[str, dict[str, Any]] = {
    "router": {"host": "127.0.0.1"},
    "worker": {"drain_timeout_s": 5},
}

T = TypeVar("T")


class FrontDoor:
    """One more front-door process of a stack (`Stack.spawn_front_door`)."""

    def __init__(self, component: Component, port: int) -> None:
        self.component = component
        self.port = port
        self.stopped = False

    @property
    def base_url(self) -> str:
        """Where it answers, without `/v1`."""
        return f"http://127.0.0.1:{self.port}"


class Stack:
    """A running stack: where it listens, its processes and their logs."""

    def __init__(
        self, launcher: Launcher, redis: PrivateRedis | None, config_path: Path, redis_url: str
    ) -> None:
        self.launcher = launcher
        self.redis = redis
        self.config_path = config_path
        self._redis_url = redis_url
        self.front_doors: list[FrontDoor] = []

    @property
    def base_url(self) -> str:
        """The front door, without `/v1`."""
        return self.launcher.base_url

    @property
    def redis_url(self) -> str:
        """The stack's Redis: its private one, or the URL given to `running_stack(redis=...)`."""
        return self._redis_url

    @property
    def log_dir(self) -> Path:
        """The folder holding every log (and the config file)."""
        return self.launcher.log_dir

    @property
    def logs(self) -> Path:
        """Same as `log_dir`."""
        return self.launcher.log_dir

    @property
    def workers(self) -> list[Component]:
        """The worker processes, in start order (killed ones included)."""
        return self.launcher.worker_components

    @property
    def router(self) -> Component:
        """The front door's process."""
        assert self.launcher.router is not None
        return self.launcher.router

    @property
    def log_paths(self) -> dict[str, Path]:
        """Each component's log file by name: `worker` (or `worker-1`, ...), `router`."""
        return {c.name: c.log_path for c in self.launcher.components if c.log_path is not None}

    @property
    def console_log(self) -> Path:
        """What the components showed on their terminal (warnings, a model loading, ...)."""
        assert self.launcher.console is not None
        return self.launcher.console

    def spawn_worker(self, env: Mapping[str, str] | None = None) -> Component:
        """Start one more worker (its log is `worker-N.log`); it is stopped with the rest."""
        return self.launcher.spawn_worker(env)

    def spawn_front_door(self, timeout_s: float = 60.0, env: Mapping[str, str] | None = None) -> FrontDoor:
        """Start one more front door on a free port, on the same Redis and config; wait until it is ready.

        Started as the Launcher starts its own (`switchboard router`, its own process group, log
        `router-N.log`); stopped (SIGTERM) before the rest of the stack. `env` is added to its
        environment (settings that differ from the config's).
        """
        port = free_port()
        name = f"router-{len(self.front_doors) + 2}"
        log_path = self.log_dir / f"{name}.log"
        log_path.write_bytes(b"")
        argv = [*SWITCHBOARD_ARGV, "--log-level", "INFO", "--config", str(self.config_path), "router"]
        environ = {**(self.launcher.env or os.environ), **(env or {}), "SWITCHBOARD_ROUTER__PORT": str(port)}
        environ.update({LOG_LABEL_ENV: name, "REDIS_URL": self.redis_url})
        with self.console_log.open("ab") as console:
            process = spawn_group([*argv, "--log-file", str(log_path)], environ, stdout=console)
        front_door = FrontDoor(Component(name=name, role="router", process=process, log_path=log_path), port)
        self.front_doors.append(front_door)
        self.wait_until(
            lambda: front_door.component.alive() and probe_readiness(front_door.base_url) is None,
            timeout_s=timeout_s,
            what=f"{name} to be ready",
        )
        return front_door

    def stop_front_door(self, front_door: FrontDoor) -> None:
        """Stop one front door `spawn_front_door` started (SIGTERM); fail if it ignores it.

        For a test that gives a front door of a shared stack its own settings: the stack goes on
        without it."""
        front_door.stopped = True
        forced = stop_groups([front_door.component.process], STOP_TIMEOUT_S)
        assert not forced, (
            f"{front_door.component.name} did not stop on SIGTERM within {STOP_TIMEOUT_S:.0f} s"
        )

    def stop_front_doors(self) -> list[int]:
        """Stop the front doors `spawn_front_door` started; the pids that ignored SIGTERM."""
        running = [door.component.process for door in self.front_doors if not door.stopped]
        return stop_groups(running, STOP_TIMEOUT_S)

    def stop_redis(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop the private Redis with `sig` (SIGKILL: a crash; SIGTERM: it writes its files and ends)."""
        redis = self._private_redis()
        if sig == signal.SIGTERM:
            redis.stop()
            return
        with redis_client.Redis.from_url(self.redis_url) as client:
            pid = int(client.info("server")["process_id"])
        os.kill(pid, sig)
        redis.stop()  # reaps it (SIGTERM to a process already gone does nothing); keeps persist_dir

    def start_redis(self, *, keep_files: bool = True) -> None:
        """Start the private Redis again on the same port (and append-only directory, if it has one).

        `keep_files=False`: it starts empty and keeps nothing on disk from now on, as a Redis without
        persistence comes back from a crash (its append-only file, if any, is not read)."""
        redis = self._private_redis()
        if not keep_files:
            redis.persist_dir = None
        redis.start()

    def _private_redis(self) -> PrivateRedis:
        if self.redis is None:
            raise RuntimeError("this stack runs on a Redis the test gave it (redis=): stop and start that")
        return self.redis

    def wait_serving(self, model: str, timeout_s: float = STACK_TIMEOUT_S) -> float:
        """Send the smallest request of `model`'s kind (a one-token chat completion for a generator)
        until it answers (loading it if needed); returns seconds."""
        entries = tomllib.loads(self.config_path.read_text()).get("models", [])
        kind = next(
            (entry.get("kind", "generate") for entry in entries if entry.get("name") == model), "generate"
        )
        return self.launcher.wait_serving(model, timeout_s, kind=kind)

    def wait_until(
        self, condition: Callable[[], T | None], *, timeout_s: float, what: str, poll_s: float = 0.1
    ) -> T:
        """Poll `condition` until it returns something true, and return that; fail naming `what`.

        Fails at once when a component exits that nobody killed.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            self.launcher.check()
            result = condition()
            if result:
                return result
            if time.monotonic() > deadline:
                pytest.fail(f"waited {timeout_s:g} s for {what}; logs in {self.log_dir}")
            time.sleep(poll_s)


def _with_test_defaults(config: str | Mapping[str, Any]) -> dict[str, Any]:
    settings = tomllib.loads(config) if isinstance(config, str) else dict(config)
    for section, defaults in TEST_DEFAULTS.items():
        settings[section] = {**defaults, **settings.get(section, {})}
    return settings


@contextlib.contextmanager
def running_stack(
    config: str | Mapping[str, Any],
    *,
    root: Path,
    workers: int = 1,
    env: Mapping[str, str] | None = None,
    worker_env: Sequence[Mapping[str, str]] = (),
    ready_timeout_s: float = STACK_TIMEOUT_S,
    session: pytest.Session | None = None,
    persist_redis: bool = False,
    redis: str | None = None,
) -> Iterator[Stack]:
    """A private Redis, `workers` workers and the front door on `config`, ready; logs and config in `root`.

    `env` reaches every component (on top of ours), `worker_env[i]` worker i only. Returns once
    `/readyz` says ready (Redis answers, a worker is alive): models are not loaded unless their
    config says `preload = true`; `Stack.wait_serving(model)` waits until one answers.
    `persist_redis`: Redis keeps an append-only file in `root/redis`, so that it can be restarted.
    `redis`: the URL of a Redis the test runs itself, used instead of a private one.
    """
    root.mkdir(parents=True, exist_ok=True)
    config_path = root / "switchboard.toml"
    settings = _with_test_defaults(config)
    # Uploaded files in the stack's own folder, never in the home folder of whoever runs the tests.
    settings.setdefault("files", {}).setdefault("store", str(root / "files"))
    config_path.write_text(toml_text(settings))
    failed = False
    persist_dir = root / "redis" if persist_redis else None
    if persist_dir is not None:
        persist_dir.mkdir()
    with contextlib.ExitStack() as owned:
        private: PrivateRedis | None = None
        if redis is None:
            private = owned.enter_context(
                PrivateRedis(persist_dir=None if persist_dir is None else str(persist_dir))
            )
            redis_url = private.url
        else:
            redis_url = redis
        launcher = Launcher(
            port=free_port(),
            log_dir=root,
            workers=workers,
            config_path=config_path,
            env={**os.environ, **(env or {})},
            redis_url=redis_url,
            worker_env=worker_env,
            console=root / "console.log",
            stop_timeout_s=STOP_TIMEOUT_S,
        )
        stack = Stack(launcher, private, config_path, redis_url)
        try:
            launcher.start()
            launcher.wait_ready(ready_timeout_s, progress=_report_progress, progress_every_s=15)
            yield stack
        except LauncherError as exc:
            failed = True
            pytest.fail(str(exc))
        except BaseException:
            failed = True
            raise
        finally:
            forced = stack.stop_front_doors() + launcher.stop()
            if failed or (session is not None and session.testsfailed):
                _print_logs(root)
        # A component that ignores SIGTERM is a bug worth failing for, not only a slow teardown.
        assert not forced, f"processes {forced} did not stop on SIGTERM within {STOP_TIMEOUT_S:.0f} s"


def _report_progress(elapsed_s: float, waiting_for: str) -> None:
    print(f"waiting for the stack ({elapsed_s:.0f} s): {waiting_for}", file=sys.stderr)


def _print_logs(root: Path) -> None:
    """A failing end-to-end test is explained by the components' logs: show their ends."""
    for log in sorted(root.glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        print(f"\n----- last lines of {log} -----", *tail, sep="\n", file=sys.stderr)
