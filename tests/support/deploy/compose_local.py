"""compose.yaml's services run as local processes, for machines with no container engine.

Each service runs its own `command` with its own `environment`, as its container would, with
what only a container has replaced by its local equivalent:

- host names of the services (and `0.0.0.0`) become 127.0.0.1, and each port a service `expose`s
  becomes a free local port, wherever the command, the environment or a mounted config names it;
- container paths of volumes, configs and secrets become folders and files under `root` (named
  volumes shared between services and replicas, as Docker shares them; configs and secrets, the
  latter from `environ` as compose takes them from .env, written with the same replacements); the
  image's home (`~/.cache`) is the `model-cache` volume;
- `switchboard` is this interpreter's `python -m switchboard`, `python` this interpreter;
- a replica is one more process with the same command and environment (`--scale`);
- a stop is SIGTERM to the main process alone (what tini does), then SIGKILL past the service's
  `stop_grace_period`; `depends_on: condition: service_healthy` waits on the dependency's own
  `healthcheck`, run locally.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from switchboard.ports import free_port
from tests.support.deploy.compose_file import (
    REPO,
    duration_s,
    environment,
    secret_files,
    secret_value,
    volume_mounts,
)

LOOPBACK = "127.0.0.1"
HOME = "/home/switchboard"
DEFAULT_GRACE_S = 10.0
# Our own variables must not leak into the services: each gets only what compose gives it.
OWN_VARIABLES = re.compile(r"^(SWITCHBOARD_|OTEL_)|^REDIS_URL$")


@dataclass
class Replica:
    """One process of a service."""

    service: str
    index: int
    process: subprocess.Popen[bytes]
    log_path: Path
    # Set when the test stopped it: its exit is then expected.
    stopped: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class LocalCompose:
    """Some services of an interpolated compose file, as processes under `root`."""

    def __init__(
        self,
        compose: Mapping[str, Any],
        *,
        root: Path,
        services: Sequence[str],
        scale: Mapping[str, int] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.compose = compose
        self.environ = dict(environ or {})
        self.root = root
        self.services = list(services)
        self.scale = dict(scale or {})
        self.ports = {
            name: {int(port): free_port() for port in compose["services"][name].get("expose", [])}
            for name in self.services
        }
        self.replicas: dict[str, list[Replica]] = {name: [] for name in self.services}
        self.forced: list[str] = []
        self._paths = {name: self._mount(name) for name in self.services}

    # --- what a container has, locally ---------------------------------------------------------

    def _mount(self, name: str) -> dict[str, Path]:
        """Container path → local path for the service's volumes and configs."""
        service = self.compose["services"][name]
        paths: dict[str, Path] = {}
        for source, target, _ in volume_mounts(service):
            if source.startswith(("/", ".")):
                paths[target] = (REPO / source).resolve()
            else:
                paths[target] = self.root / "volumes" / source
                paths[target].mkdir(parents=True, exist_ok=True)
        for config in service.get("configs", []):
            paths[config["target"]] = self.root / "configs" / name / Path(config["target"]).name
        secrets = secret_files(self.compose, service)
        for target in secrets:
            paths[target] = self.root / "secrets" / name / Path(target).name
        for config in service.get("configs", []):
            source = REPO / self.compose["configs"][config["source"]]["file"]
            local = paths[config["target"]]
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(self._rewrite(source.read_text(), name, paths))
        for target, secret in secrets.items():
            local = paths[target]
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(self._rewrite(secret_value(self.compose, secret, self.environ), name, paths))
            local.chmod(0o600)
        return paths

    def _rewrite(self, text: str, name: str, paths: Mapping[str, Path] | None = None) -> str:
        """`text` as the service's process sees it here: local addresses, ports and paths."""
        own = self.ports[name]

        def address(match: re.Match[str]) -> str:
            host, port = match[1], int(match[2])
            if host in self.ports and port in self.ports[host]:
                return f"{LOOPBACK}:{self.ports[host][port]}"
            if host in (LOOPBACK, "localhost", "0.0.0.0") and port in own:
                return f"{LOOPBACK}:{own[port]}"
            return match[0]

        text = re.sub(r"(?<![\w.-])([A-Za-z0-9_.-]+):(\d+)(?!\d)", address, text)
        for port, local in own.items():
            text = re.sub(rf"(?<![\d:.]){port}(?!\d)", str(local), text)
        text = text.replace("0.0.0.0", LOOPBACK)
        mounted = self._paths.get(name, {}) if paths is None else paths
        for target, local in sorted(mounted.items(), key=lambda item: -len(item[0])):
            text = re.sub(rf"(?<![\w/.]){re.escape(target)}(?![\w.-])", str(local), text)
        return text

    def _argv(self, name: str, argv: Sequence[str]) -> list[str]:
        argv = [self._rewrite(str(arg), name) for arg in argv]
        if argv[0] == "switchboard":
            return [sys.executable, "-m", "switchboard", *argv[1:]]
        if argv[0] == "python":
            return [sys.executable, *argv[1:]]
        program = shutil.which(argv[0])
        assert program is not None, f"{name}: `{argv[0]}` is not installed here"
        return [program, *argv[1:]]

    def _home(self, name: str) -> Path:
        """The image's home: its ~/.cache is the volume mounted there, if any."""
        home = self.root / "home" / name
        cache = self._paths[name].get(f"{HOME}/.cache")
        home.mkdir(parents=True, exist_ok=True)
        if cache is not None and not (home / ".cache").exists():
            (home / ".cache").symlink_to(cache)
        return home

    def environment(self, name: str) -> dict[str, str]:
        """The process environment of one of the service's replicas."""
        base = {key: value for key, value in os.environ.items() if not OWN_VARIABLES.match(key)}
        env = {
            key: self._rewrite(value, name)
            for key, value in environment(self.compose["services"][name]).items()
        }
        return {**base, "HOME": str(self._home(name)), **env}

    def port(self, name: str, container_port: int) -> int:
        """The local port standing for the service's `container_port`."""
        return self.ports[name][container_port]

    # --- running -------------------------------------------------------------------------------

    def up(self, timeout_s: float) -> None:
        """Start every service in `depends_on` order, waiting on healthchecks where compose would."""
        for name in self._start_order():
            for dependency, condition in self._dependencies(name).items():
                if condition == "service_healthy":
                    self.wait_healthy(dependency, timeout_s)
            for _ in range(self.scale.get(name, 1)):
                self.start_replica(name)

    def start_replica(self, name: str) -> Replica:
        """One more process of the service (`--scale name=N+1`)."""
        service = self.compose["services"][name]
        index = len(self.replicas[name])
        log_path = self.root / "logs" / f"{name}-{index + 1}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                self._argv(name, service["command"]),
                env=self.environment(name),
                cwd=self._home(name),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        replica = Replica(name, index, process, log_path)
        self.replicas[name].append(replica)
        return replica

    def healthy(self, name: str) -> bool:
        """Whether the service's healthcheck passes now, run as compose runs it."""
        test = self.compose["services"][name]["healthcheck"]["test"]
        argv = test[1:] if test[0] == "CMD" else ["sh", "-c", test[1]]
        check = subprocess.run(
            self._argv(name, argv),
            env=self.environment(name),
            capture_output=True,
            timeout=duration_s(self.compose["services"][name]["healthcheck"].get("timeout", "30s")),
        )
        return check.returncode == 0

    def wait_healthy(self, name: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.healthy(name):
            self.check()
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{name} not healthy after {timeout_s:.0f} s; logs in {self.root / 'logs'}"
                )
            time.sleep(0.25)

    def check(self) -> None:
        """Fail when a replica has exited that nobody stopped."""
        for replicas in self.replicas.values():
            for replica in replicas:
                code = replica.process.poll()
                if code is not None and not replica.stopped:
                    raise AssertionError(
                        f"{replica.service}-{replica.index + 1} exited with {code}:\n{replica.log()[-3000:]}"
                    )

    def stop_replica(self, replica: Replica) -> None:
        """SIGTERM to the replica's main process, as `docker compose stop` (through tini) sends it."""
        replica.stopped = True
        replica.process.send_signal(signal.SIGTERM)

    def grace_s(self, name: str) -> float:
        grace = self.compose["services"][name].get("stop_grace_period")
        return DEFAULT_GRACE_S if grace is None else duration_s(grace)

    def down(self) -> None:
        """Stop everything in reverse start order; what outlives its grace period is killed and noted."""
        for name in reversed(self._start_order()):
            for replica in self.replicas[name]:
                if replica.process.poll() is None:
                    self.stop_replica(replica)
            for replica in self.replicas[name]:
                try:
                    replica.process.wait(self.grace_s(name))
                except subprocess.TimeoutExpired:
                    self.forced.append(f"{name}-{replica.index + 1}")
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(replica.pid, signal.SIGKILL)
                replica.process.wait()

    def _dependencies(self, name: str) -> dict[str, str]:
        depends_on = self.compose["services"][name].get("depends_on") or {}
        if isinstance(depends_on, list):
            return {dependency: "service_started" for dependency in depends_on}
        return {dependency: spec["condition"] for dependency, spec in depends_on.items()}

    def _start_order(self) -> list[str]:
        order: list[str] = []

        def visit(name: str) -> None:
            if name in order:
                return
            for dependency in self._dependencies(name):
                assert dependency in self.services, f"{name} needs {dependency}, which is not started"
                visit(dependency)
            order.append(name)

        for name in self.services:
            visit(name)
        return order

    def __enter__(self) -> LocalCompose:
        return self

    def __exit__(self, *_: object) -> None:
        self.down()
