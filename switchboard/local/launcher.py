"""Start N workers and the front door, wait until they serve, stop them in reverse.

`switchboard up`, the end-to-end tests and the benchmarks start Switchboard this one way. Each
component is `switchboard [--config C] --log-level L worker|router --log-file DIR/NAME.log`, the
leader of a process group of its own, so that stopping it also ends Triton and the engine processes
it started. The log file takes everything the component and its children print; what the component
shows a person (see `switchboard.logs`) goes to our stderr, or to the `console` file.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from switchboard.config import ModelKind
from switchboard.local.processes import spawn_group, stop_groups
from switchboard.logs import LOG_LABEL_ENV
from switchboard.ports import local_url_host
from switchboard.private_files import append_private, private_dir, write_private
from switchboard.readiness import WAITING_FOR

SWITCHBOARD_ARGV = (sys.executable, "-m", "switchboard")
POLL_S = 0.25
LOG_TAIL_LINES = 20

# Called now and then while waiting: seconds waited so far, and what is awaited.
Progress = Callable[[float, str], None]


class LauncherError(RuntimeError):
    """The stack did not come up; the message says which part, and where its log is."""


class ComponentExited(LauncherError):
    """A component exited while it should be running."""

    def __init__(self, component: Component) -> None:
        self.component = component
        code = component.exit_code
        if code is not None and code < 0:
            message = f"{component.name} was ended by {_signal_name(-code)}"
        else:
            message = f"{component.name} exited with code {code}"
        tail = component.log_tail(LOG_TAIL_LINES)
        if component.log_path is not None:
            message += f"; its log is {component.log_path}"
        if tail:
            message += ", ending with:\n" + "\n".join(f"    {line}" for line in tail)
        super().__init__(message)


class NotReady(LauncherError):
    """The stack did not serve within the time allowed."""


@dataclass
class Component:
    """One started process of the stack: a worker or the front door."""

    name: str
    role: str
    process: subprocess.Popen[bytes]
    log_path: Path | None
    # Set by `kill`: its end was asked for, so watching the stack no longer counts it as a failure.
    killed: bool = False

    @property
    def pid(self) -> int:
        """The process id, which is also its process group's id."""
        return self.process.pid

    @property
    def exit_code(self) -> int | None:
        """None while it runs."""
        return self.process.poll()

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.process.poll() is None

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send `sig` to the whole group (the engine's processes too); with SIGKILL, wait for the end.

        A test's way to lose a worker; `Launcher.check` ignores a component killed this way.
        """
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        if sig == signal.SIGKILL:
            self.process.wait()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> list[str]:
        """The last lines of its log file (none when it logs to the terminal)."""
        if self.log_path is None or not self.log_path.is_file():
            return []
        return self.log_path.read_text(errors="replace").splitlines()[-lines:]


@dataclass
class Launcher:
    """Workers and the front door of one stack, started, watched and stopped together.

    `port` is the front door's port and `host` its address (None: the configured one);
    `redis_url`, when given, reaches every component as REDIS_URL; `redis_url_file` as REDIS_URL_FILE,
    which keeps a password out of the components' environment too.
    With `verbose` the components keep everything on the terminal and write no log file.
    """

    port: int
    log_dir: Path
    host: str | None = None
    workers: int = 1
    config_path: Path | None = None
    env: Mapping[str, str] | None = None
    redis_url: str | None = None
    redis_url_file: Path | None = None
    # Extra environment for worker i (0-based), on top of `env`, so workers can differ.
    worker_env: Sequence[Mapping[str, str]] = ()
    argv_prefix: Sequence[str] = SWITCHBOARD_ARGV
    log_level: str = "INFO"
    verbose: bool = False
    # Where the components' terminal lines go: our own stderr when None.
    console: Path | None = None
    cwd: Path | None = None
    stop_timeout_s: float = 90.0
    _workers: list[Component] = field(default_factory=list, init=False)
    _router: Component | None = field(default=None, init=False)
    _stopped: bool = field(default=False, init=False)

    @property
    def base_url(self) -> str:
        """Where the front door answers, without the `/v1`."""
        return f"http://{local_url_host(self.host or '127.0.0.1')}:{self.port}"

    @property
    def worker_components(self) -> list[Component]:
        """The workers started so far, in order (killed ones included)."""
        return list(self._workers)

    @property
    def router(self) -> Component | None:
        """The front door, once started."""
        return self._router

    @property
    def components(self) -> list[Component]:
        """Everything started, in start order: the workers, then the front door."""
        return [*self._workers, *([self._router] if self._router else [])]

    def start(self) -> Launcher:
        """Start the workers, then the front door; returns at once (see `wait_ready`)."""
        if self.workers < 1:
            raise ValueError("a stack needs at least one worker")
        # Workers' logs quote requests: the folder is this user's alone from its creation on.
        private_dir(self.log_dir)
        try:
            for _ in range(self.workers):
                self.spawn_worker()
            self._router = self._spawn("router", "router", {})
        except BaseException:
            self.stop()
            raise
        return self

    def spawn_worker(self, env: Mapping[str, str] | None = None) -> Component:
        """Start one more worker (also after `start`, for example to replace one a test killed)."""
        index = len(self._workers)
        name = "worker" if self.workers == 1 and index == 0 else f"worker-{index + 1}"
        extra = dict(self.worker_env[index]) if index < len(self.worker_env) else {}
        component = self._spawn(name, "worker", {**extra, **(env or {})})
        self._workers.append(component)
        return component

    def _spawn(self, name: str, role: str, extra_env: Mapping[str, str]) -> Component:
        argv = [*self.argv_prefix, "--log-level", self.log_level]
        if self.config_path is not None:
            argv += ["--config", str(self.config_path)]
        if self.verbose:
            argv.append("--verbose")
        argv.append(role)
        log_path = None
        if not self.verbose:
            log_path = self.log_dir / f"{name}.log"
            write_private(log_path, "")  # one run per file (0600 from the start): the component appends to it
            argv += ["--log-file", str(log_path)]
        env = {**(os.environ if self.env is None else self.env), **extra_env}
        env["SWITCHBOARD_ROUTER__PORT"] = str(self.port)
        if self.host is not None:
            env["SWITCHBOARD_ROUTER__HOST"] = self.host
        env[LOG_LABEL_ENV] = name
        if self.redis_url is not None:
            env["REDIS_URL"] = self.redis_url
        if self.redis_url_file is not None:
            env.pop("REDIS_URL", None)  # it would win over the file
            env["REDIS_URL_FILE"] = str(self.redis_url_file)
        with contextlib.ExitStack() as stack:
            console = stack.enter_context(append_private(self.console)) if self.console else None
            process = spawn_group(argv, env, stdout=console, cwd=self.cwd)
        return Component(name=name, role=role, process=process, log_path=log_path)

    def check(self) -> None:
        """Raise ComponentExited if a component has exited (other than by `Component.kill`)."""
        for component in self.components:
            if not component.killed and not component.alive():
                raise ComponentExited(component)

    def wait_ready(
        self, timeout_s: float, progress: Progress | None = None, progress_every_s: float = 10.0
    ) -> float:
        """Poll `/readyz` until the front door is ready (Redis answers, a worker is alive with Triton
        running and its engines' runtime imported); returns seconds. `progress` is called every
        `progress_every_s` (0: on every poll).

        Raises ComponentExited as soon as a component exits, NotReady past `timeout_s`.
        """
        started = time.monotonic()
        next_report = started + progress_every_s
        while True:
            self.check()
            waiting_for = probe_readiness(self.base_url, workers=self._workers_running())
            elapsed = time.monotonic() - started
            if waiting_for is None:
                return elapsed
            if elapsed > timeout_s:
                raise NotReady(f"not ready after {timeout_s:.0f} s ({waiting_for}); logs in {self.log_dir}")
            if progress is not None and time.monotonic() >= next_report:
                progress(elapsed, waiting_for)
                next_report += progress_every_s
            time.sleep(POLL_S)

    def _workers_running(self) -> int:
        return sum(1 for worker in self._workers if not worker.killed and worker.alive())

    def wait_serving(
        self,
        model: str,
        timeout_s: float,
        progress: Progress | None = None,
        progress_every_s: float = 10.0,
        kind: ModelKind = "generate",
    ) -> float:
        """Send `model` the smallest request of its `kind` (a one-token chat completion for a
        generator) until one succeeds (it loads on the first); returns seconds.

        Raises ComponentExited as soon as a component exits, NotReady past `timeout_s`, and
        LauncherError when the front door refuses the request (a 4xx: the model is unknown, say).
        """
        started = time.monotonic()
        next_report = started + progress_every_s
        while True:
            attempt = _ServingAttempt(self.base_url, model, timeout_s, kind)
            while not attempt.done.wait(POLL_S):
                self.check()
                elapsed = time.monotonic() - started
                if elapsed > timeout_s:
                    raise NotReady(f"{model} did not answer within {timeout_s:.0f} s; logs in {self.log_dir}")
                if progress is not None and time.monotonic() >= next_report:
                    progress(elapsed, f"waiting for {model} to answer")
                    next_report += progress_every_s
            if attempt.status == 200:
                return time.monotonic() - started
            if attempt.refused():
                raise LauncherError(f"the front door refused a request for {model}: {attempt.error}")
            self.check()
            if time.monotonic() - started > timeout_s:
                raise NotReady(f"{model} did not answer within {timeout_s:.0f} s: {attempt.error}")
            time.sleep(POLL_S)

    def stop(self) -> list[int]:
        """Stop the front door (no new work), then the workers, last started first; idempotent.

        Returns the pids that had to be killed because they ignored SIGTERM for `stop_timeout_s`.
        """
        if self._stopped:
            return []
        self._stopped = True
        router = [self._router.process] if self._router else []
        forced = stop_groups(router, self.stop_timeout_s)
        return forced + stop_groups([w.process for w in reversed(self._workers)], self.stop_timeout_s)

    def __enter__(self) -> Launcher:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def probe_readiness(base_url: str, workers: int = 0) -> str | None:
    """None when `/readyz` says ready with at least `workers` workers prepared (a first request
    may be loaded on any of them); otherwise what the stack is waiting for, in words."""
    try:
        with urllib.request.urlopen(f"{base_url}/readyz", timeout=2) as response:
            prepared = json.loads(response.read()).get("workers_prepared")
    except urllib.error.HTTPError as exc:
        return _waiting_for(exc)
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        return "the front door is not listening yet"
    # (A front door of an older release does not count them: its ready is taken as it is.)
    if isinstance(prepared, int) and prepared < workers:
        return f"{workers - prepared} of {workers} workers to prepare their engines"
    return None


def _waiting_for(exc: urllib.error.HTTPError) -> str:
    """What a not-ready `/readyz` answer says the stack is waiting for."""
    try:
        error = json.loads(exc.read())["error"]
    except (ValueError, KeyError, TypeError, OSError):
        return f"the front door answered {exc.code}"
    return WAITING_FOR.get(error.get("code"), str(error.get("message")))


# The smallest request each kind of model answers: where it goes, and its body past the model.
SMALLEST_REQUEST: dict[ModelKind, tuple[str, dict[str, Any]]] = {
    "generate": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1},
    ),
    "embed": ("/v1/embeddings", {"input": "Hello"}),
    "classify": ("/classify", {"input": "Hello"}),
    "score": ("/rerank", {"query": "Hello", "documents": ["Hello"]}),
}


class _ServingAttempt:
    """One small request for a model in a thread, so the caller can watch the components meanwhile."""

    def __init__(self, base_url: str, model: str, timeout_s: float, kind: ModelKind) -> None:
        path, body = SMALLEST_REQUEST[kind]
        self._request = urllib.request.Request(
            f"{base_url}{path}",
            data=json.dumps({"model": model, **body}).encode(),
            headers={"Content-Type": "application/json"},
        )
        self._timeout_s = timeout_s
        self.status: int | None = None
        self.error = ""
        self.done = threading.Event()
        # A daemon: a request left waiting when a component dies must not keep the caller alive.
        threading.Thread(target=self._run, name=f"serving-{model}", daemon=True).start()

    def refused(self) -> bool:
        """The front door said no for good (a 4xx other than timeout or rate limit): trying again won't help."""
        return self.status is not None and 400 <= self.status < 500 and self.status not in (408, 429)

    def _run(self) -> None:
        try:
            with urllib.request.urlopen(self._request, timeout=self._timeout_s) as reply:
                self.status = reply.status
        except urllib.error.HTTPError as exc:
            self.status = exc.code
            self.error = f"{exc.code} {exc.read()[:500].decode(errors='replace')}"
        except (urllib.error.URLError, OSError) as exc:
            self.error = str(exc)
        finally:
            self.done.set()
