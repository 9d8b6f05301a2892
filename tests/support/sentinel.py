"""A real Sentinel-watched Redis on loopback: a primary, a replica and three sentinels, for failover tests.

Every process is a real `redis-server` (`--sentinel` for the sentinels: Debian's `redis-sentinel`
is only a link to the same binary). Failure is detected in 1 s (down-after-milliseconds), a quorum
of two sentinels decides, and a promotion takes a few seconds after a kill. The sentinels are told
each other and the replica at start (their config holds what they would otherwise learn from
hello messages within seconds), and `start` still waits until each reports them.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from switchboard import with_parent
from switchboard.ports import free_port

MASTER_NAME = "switchboard"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000
QUORUM = 2
SENTINELS = 3


class RedisProcess:
    """One redis-server (or sentinel) on 127.0.0.1, its config in `directory`, its output in a log."""

    def __init__(
        self, directory: Path, name: str, config: str, *, sentinel: bool = False, port: int | None = None
    ) -> None:
        self.port = port or free_port()
        self.name = name
        self.sentinel = sentinel
        self.config_path = directory / f"{name}.conf"
        self.log_path = directory / f"{name}.log"
        self.config_path.write_text(f"port {self.port}\nbind 127.0.0.1\ndir {directory}\n" + config)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH")
        argv = [binary, str(self.config_path), *(["--sentinel"] if self.sentinel else [])]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(with_parent.wrap(argv), stdout=log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL: the process ends with no chance to save or hand anything over."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """The end of a test: nothing it holds needs saving, so SIGKILL (a stopped process ends too)."""
        self.kill()
        self.process = None


class SentinelTopology:
    """A primary, one replica of it and three sentinels watching them, all started by `start()`.

    `url` reaches the primary through the sentinels, as a deployment's REDIS_URL would. Sentinels
    have their own password, which the URL passes in `sentinel_password`.
    """

    def __init__(self) -> None:
        self.password = secrets.token_urlsafe(16)
        self.sentinel_password = secrets.token_urlsafe(16)
        self._workdir = tempfile.TemporaryDirectory(prefix="switchboard-sentinel-")
        directory = Path(self._workdir.name)
        node_config = (
            f'requirepass "{self.password}"\nmasterauth "{self.password}"\n'
            # An empty replica syncs at once instead of waiting for more replicas to share a transfer.
            'save ""\nappendonly no\nrepl-diskless-sync-delay 0\n'
        )
        self.primary = RedisProcess(directory, "primary", node_config)
        self.replica = RedisProcess(
            directory, "replica", node_config + f"replicaof 127.0.0.1 {self.primary.port}\n"
        )
        self.nodes = [self.primary, self.replica]
        ids = [secrets.token_hex(20) for _ in range(SENTINELS)]
        ports = [free_port() for _ in range(SENTINELS)]
        self.sentinels = [self._sentinel(directory, index, ids, ports) for index in range(SENTINELS)]

    def _sentinel(self, directory: Path, index: int, ids: list[str], ports: list[int]) -> RedisProcess:
        lines = [
            f'requirepass "{self.sentinel_password}"',
            f'sentinel sentinel-pass "{self.sentinel_password}"',
            f"sentinel myid {ids[index]}",
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.primary.port} {QUORUM}",
            f'sentinel auth-pass {MASTER_NAME} "{self.password}"',
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}",
            f"sentinel known-replica {MASTER_NAME} 127.0.0.1 {self.replica.port}",
            *(
                f"sentinel known-sentinel {MASTER_NAME} 127.0.0.1 {ports[other]} {ids[other]}"
                for other in range(SENTINELS)
                if other != index
            ),
        ]
        config = "\n".join(lines) + "\n"
        return RedisProcess(directory, f"sentinel-{index}", config, sentinel=True, port=ports[index])

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{sentinel.port}" for sentinel in self.sentinels)
        return (
            f"redis+sentinel://:{self.password}@{hosts}/{MASTER_NAME}/0"
            f"?sentinel_password={self.sentinel_password}"
        )

    def start(self, timeout_s: float = 30.0) -> SentinelTopology:
        """Start every process and wait until the replica is in sync and each sentinel sees the rest."""
        deadline = time.monotonic() + timeout_s
        for node in self.nodes:
            node.start()
        # The sentinels start once the replica is in sync: they ask a replica for its state when
        # they first see it, then only every 10 s, and one seen out of sync cannot be promoted.
        _wait_for(lambda: self._replica_in_sync(self.replica), deadline, "the replica to sync")
        for sentinel in self.sentinels:
            sentinel.start()
        _wait_for(self._sentinels_agree, deadline, "the sentinels to see the replica and each other")
        return self

    def stop(self) -> None:
        for process in (*self.sentinels, *self.nodes):
            process.stop()
        self._workdir.cleanup()

    def __enter__(self) -> SentinelTopology:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # What the sentinels say.

    def primary_port(self) -> int:
        """The port of the node the sentinels name as primary now."""
        with self._sentinel_client(self.sentinels[0]) as client:
            _, port = client.sentinel_get_master_addr_by_name(MASTER_NAME)
        return int(port)

    def current_primary(self) -> RedisProcess:
        port = self.primary_port()
        return next(node for node in self.nodes if node.port == port)

    def current_replica(self) -> RedisProcess:
        port = self.primary_port()
        return next(node for node in self.nodes if node.port != port)

    def kill_primary(self) -> RedisProcess:
        """SIGKILL the node that is primary now; returns it."""
        primary = self.current_primary()
        primary.kill()
        return primary

    @contextlib.contextmanager
    def replication_cut(self) -> Iterator[None]:
        """While inside, the primary acknowledges writes that its replica never gets (until it is back).

        The replica is stopped, so that it cannot connect again, and the primary drops its link to it
        (stopping it alone is not enough: what the primary sends waits in the replica's socket).
        """
        replica = self.current_replica()
        replica.signal(signal.SIGSTOP)
        try:
            with self.node_client(self.current_primary()) as client:
                client.client_kill_filter(_type="replica")
            yield
        finally:
            replica.signal(signal.SIGCONT)

    def failover(self) -> None:
        """Ask a sentinel for a failover (SENTINEL FAILOVER): the replica is promoted, the primary demoted."""
        with self._sentinel_client(self.sentinels[0]) as client:
            client.sentinel_failover(MASTER_NAME)

    def wait_promoted(self, old_port: int, timeout_s: float = 15.0) -> float:
        """Wait until every sentinel names a primary other than `old_port` that answers as one.

        Returns the monotonic time it was first seen.
        """
        deadline = time.monotonic() + timeout_s
        _wait_for(lambda: self._promoted(old_port), deadline, "a replica to be promoted")
        return time.monotonic()

    def node_client(self, node: RedisProcess) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=node.port, password=self.password, socket_timeout=2)

    def _sentinel_client(self, sentinel: RedisProcess) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=sentinel.port, password=self.sentinel_password, socket_timeout=2
        )

    def _replica_in_sync(self, node: RedisProcess) -> bool:
        with self.node_client(node) as client:
            info: dict[str, Any] = client.info("replication")
        return info.get("role") == "slave" and info.get("master_link_status") == "up"

    def _sentinels_agree(self) -> bool:
        for sentinel in self.sentinels:
            with self._sentinel_client(sentinel) as client:
                if not _sees_all(client):
                    return False
        return True

    def _promoted(self, old_port: int) -> bool:
        for sentinel in self.sentinels:
            with self._sentinel_client(sentinel) as client:
                _, port = client.sentinel_get_master_addr_by_name(MASTER_NAME)
            if int(port) == old_port:
                return False
        node = next(node for node in self.nodes if node.port == int(port))
        with self.node_client(node) as client:
            return bool(client.info("replication").get("role") == "master")


def _sees_all(client: redis.Redis) -> bool:
    """Whether a sentinel sees the primary up, the other sentinels, and the replica ready to promote."""
    state: dict[str, Any] = client.sentinel_master(MASTER_NAME)  # type: ignore[assignment]
    if state["flags"] != "master" or state["num-other-sentinels"] < SENTINELS - 1:
        return False
    replicas = client.sentinel_slaves(MASTER_NAME)
    # Its INFO is fresh and says it is in sync: otherwise SENTINEL FAILOVER answers NOGOODSLAVE.
    return bool(replicas) and all(
        replica["flags"] == "slave" and replica["master-link-status"] == "ok" for replica in replicas
    )


def _wait_for(check: Any, deadline: float, what: str) -> None:
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (redis.RedisError, OSError) as exc:
            last_error = exc
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what} (last error: {last_error})")
