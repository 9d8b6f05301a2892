"""Real redis-server processes that a test kills and starts again, each on its own loopback port.

`PrivateRedis` is what `switchboard up` runs; a test of restarts, lost writes or failover needs
more: a SIGKILL instead of a clean stop, a start from the files the last run left (or from a
snapshot the test put there), and extra configuration (snapshots, a slow load, replication).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from switchboard import with_parent
from switchboard.local.redis_server import answers_ping
from switchboard.ports import free_port


class RedisNodeError(RuntimeError):
    """A redis-server of a test did not start or stop as asked."""


class RedisNode:
    """One redis-server on 127.0.0.1 with its own data directory under `tmp_path`.

    It keeps nothing on disk unless `extra_args` say so (they follow, and so override, the
    defaults: `--save ""`, `--appendonly no`). The port, the password and the directory hold across
    `kill()` and `start()`, so a start after a kill is a restart as clients see it: the same
    address, with whatever the directory held. `password=None`: no password is asked for.

    The server gets SIGTERM when the thread that started it ends (`with_parent`, so that a test
    killed outright leaves none behind): start it from a thread that outlives it, not from an
    executor's (`asyncio.to_thread`).
    """

    def __init__(self, tmp_path: Path, password: str | None = None, extra_args: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.password = password
        self.extra_args = tuple(extra_args)
        self.dir = Path(tmp_path) / f"redis-{self.port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Where clients connect (with the password, if any)."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        """The running server's process id."""
        if self._process is None:
            raise RedisNodeError("the node is not running")
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float = 10.0, *, wait_loaded: bool = True) -> RedisNode:
        """Start the server; wait until it answers PING (`wait_loaded`: until it has loaded its
        data, too), or only until it accepts connections."""
        if self.running:
            raise RedisNodeError(f"the node on port {self.port} is already running")
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisNodeError("redis-server is not on PATH")
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir)]
        args += ["--save", "", "--appendonly", "no", "--loglevel", "warning"]
        if self.password:
            args += ["--requirepass", self.password]
        # Ends with the test process even if that is killed outright.
        self._process = subprocess.Popen(
            with_parent.wrap([*args, *self.extra_args]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._wait(timeout_s, wait_loaded)
        return self

    def kill(self) -> None:
        """SIGKILL the server, as a crash or an out-of-memory kill would end it: nothing is saved."""
        self._end(signal.SIGKILL)

    def stop(self) -> None:
        """Stop the server as an operator would (SIGTERM: it saves first if persistence is on);
        idempotent."""
        self._end(signal.SIGTERM)

    def _end(self, sig: signal.Signals) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            os.kill(process.pid, sig)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _wait(self, timeout_s: float, wait_loaded: bool) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RedisNodeError(f"redis-server exited at start (code {self._process.returncode})")
            if answers_ping(self.port, self.password, loaded=wait_loaded):
                return
            time.sleep(0.05)
        self.kill()
        raise RedisNodeError(f"redis-server did not answer on port {self.port} within {timeout_s:g} s")

    def __enter__(self) -> RedisNode:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
