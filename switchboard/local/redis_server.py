"""A private redis-server on a free port, for `switchboard up` and the tests.

Other local users must neither use it (any client could mint an admin key or read queued prompts)
nor read its files. So it asks every client for a password made at start, which reaches it in a
config file that only this user can read, never on its command line; its folders are 0700 and its
files 0600. Clients get the password in `url`, or from the file at `url_file`.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from switchboard import with_parent
from switchboard.ports import free_port
from switchboard.private_files import (
    PRIVATE_UMASK,
    make_private_tree,
    private_dir,
    remove_dirs_of_gone_processes,
    write_private,
)

INSTALL_HINT = (
    "redis-server was not found on PATH. Install it (Debian/Ubuntu: `apt-get install -y redis-server`, "
    "or run `make install`), or point Switchboard at an existing server with REDIS_URL=redis://host:6379/0."
)


class RedisServerError(RuntimeError):
    """The private Redis server could not be started."""


# switchboard-redis-<pid of the process that started it>-<random>
_RUN_DIR = re.compile(r"^switchboard-redis-(\d+)-")

# Past this much data, writes are refused (noeviction): a full Redis answers errors that the
# front door turns into 503s, instead of evicting queued jobs or being killed for memory.
DEFAULT_MAXMEMORY = "1gb"


class PrivateRedis:
    """A redis-server child process on 127.0.0.1 that stops with its owner, behind a password.

    It keeps nothing on disk, unless `persist_dir` is given: then it keeps an append-only file
    there, which a server started again on that directory reads back (the directory is left alone,
    but made private). The password holds for the object's life, across a stop and a start.
    """

    def __init__(
        self, port: int | None = None, maxmemory: str = DEFAULT_MAXMEMORY, *, persist_dir: str | None = None
    ) -> None:
        self.port = port or free_port()
        self.maxmemory = maxmemory
        self.persist_dir = persist_dir
        self.password = secrets.token_urlsafe(32)
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def address(self) -> str:
        """Where clients connect, without the password: for people and logs."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def url(self) -> str:
        """Where clients connect, with the password: a secret."""
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    @property
    def url_file(self) -> Path:
        """A file only this user can read that holds `url` (for REDIS_URL_FILE), while it runs."""
        return self._run_dir() / "redis.url"

    def start(self, timeout_s: float = 10.0) -> PrivateRedis:
        """Start the server and wait until it answers PING."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisServerError(INSTALL_HINT)
        # The password, its URL and (unless persisted) the data live in a 0700 folder of this run;
        # those of runs killed outright (their servers ended with them) go first.
        remove_dirs_of_gone_processes(Path(tempfile.gettempdir()), _RUN_DIR)
        self._workdir = tempfile.TemporaryDirectory(prefix=f"switchboard-redis-{os.getpid()}-")
        config = write_private(self._run_dir() / "redis.conf", f'requirepass "{self.password}"\n')
        write_private(self.url_file, self.url + "\n")
        directory = self._workdir.name
        if self.persist_dir is not None:
            directory = str(private_dir(Path(self.persist_dir)))
            make_private_tree(Path(directory))
        # Ends with the process that started it, even one killed without a chance to stop it.
        self._process = subprocess.Popen(
            with_parent.wrap(
                [
                    binary,
                    str(config),
                    "--port",
                    str(self.port),
                    # Loopback only: nothing else on the network reaches it, password or not.
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
            # Not in the terminal's foreground process group: Ctrl-C there must not stop Redis
            # before the workers, which still use it while they stop (`stop` ends it last).
            process_group=0,
            # What it writes (append-only file, snapshot) is this user's alone.
            umask=PRIVATE_UMASK,
        )
        self._wait_ready(timeout_s)
        return self

    def _run_dir(self) -> Path:
        if self._workdir is None:
            raise RedisServerError("start() the private Redis first")
        return Path(self._workdir.name)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RedisServerError(f"redis-server exited at start (code {self._process.returncode})")
            if answers_ping(self.port, self.password):
                return
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


def answers_ping(port: int, password: str | None, *, loaded: bool = True) -> bool:
    """Whether the redis-server on 127.0.0.1:`port` accepts a connection and, with `loaded`, answers
    PING (after AUTH with `password`, if any) as one that has loaded its data does."""
    hello, expected = b"PING\r\n", b"+PONG\r\n"
    if password:
        hello, expected = f"AUTH {password}\r\n".encode() + hello, b"+OK\r\n" + expected
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            if not loaded:
                return True
            sock.sendall(hello)
            return _replies(sock, expected.count(b"\r\n")) == expected
    except OSError:
        return False


def _replies(sock: socket.socket, count: int) -> bytes:
    """The first `count` one-line replies on `sock` (Redis answers a PING while loading with an error)."""
    received = b""
    while received.count(b"\r\n") < count:
        data = sock.recv(256)
        if not data:
            break
        received += data
    return received
