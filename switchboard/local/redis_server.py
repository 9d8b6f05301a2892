"""A private redis-server on a free port, for `switchboard up` and the tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time

from switchboard.local import with_parent
from switchboard.ports import free_port

INSTALL_HINT = (
    "redis-server was not found on PATH. Install it (Debian/Ubuntu: `apt-get install -y redis-server`, "
    "or run `make install`), or point Switchboard at an existing server with REDIS_URL=redis://host:6379/0."
)


class RedisServerError(RuntimeError):
    """The private Redis server could not be started."""


# Past this much data, writes are refused (noeviction): a full Redis answers errors that the
# front door turns into 503s, instead of evicting queued jobs or being killed for memory.
DEFAULT_MAXMEMORY = "1gb"


class PrivateRedis:
    """A redis-server child process on 127.0.0.1 that stops with its owner.

    It keeps nothing on disk, unless `persist_dir` is given: then it keeps an append-only file
    there, which a server started again on that directory reads back (the directory is left alone).
    """

    def __init__(
        self, port: int | None = None, maxmemory: str = DEFAULT_MAXMEMORY, *, persist_dir: str | None = None
    ) -> None:
        self.port = port or free_port()
        self.maxmemory = maxmemory
        self.persist_dir = persist_dir
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        """Where clients connect."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> PrivateRedis:
        """Start the server and wait until it answers PING."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisServerError(INSTALL_HINT)
        directory = self.persist_dir
        if directory is None:
            self._workdir = tempfile.TemporaryDirectory(prefix="switchboard-redis-")
            directory = self._workdir.name
        # Ends with the process that started it, even one killed without a chance to stop it.
        self._process = subprocess.Popen(
            with_parent.wrap(
                [
                    binary,
                    "--port",
                    str(self.port),
                    # Loopback only, so that nothing else on the network reaches this password-less server.
                    "--bind",
                    "127.0.0.1",
                    "--maxmemory",
                    self.maxmemory,
                    "--maxmemory-policy",
                    "noeviction",
                    "--save",
                    "",
                    "--appendonly",
                    "no" if self.persist_dir is None else "yes",
                    "--dir",
                    directory,
                    "--loglevel",
                    "warning",
                ]
            ),
            stdout=subprocess.DEVNULL,
        )
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RedisServerError(f"redis-server exited at start (code {self._process.returncode})")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RedisServerError(f"redis-server did not answer on port {self.port} within {timeout_s:g} s")

    def stop(self) -> None:
        """Stop the server and remove its directory; idempotent."""
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> PrivateRedis:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
