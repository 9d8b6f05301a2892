"""compose.yaml's `sentinel` profile run for real, as local processes: redis, its replica and the
three sentinels, each from its own start script.

No container engine runs here, so each service's script (as compose hands it to `sh -c`) runs
here with what only a container has replaced: each service's host name is a loopback address of its
own (127.x.y.z: every service keeps its container port), its secret file and its /data a file and a
folder of its own. What the static checks cannot tell is then shown: the configurations the scripts
write are ones Redis and Sentinel accept, the replica copies `redis`, the sentinels find it and its
replica, a client given env.example's URL writes through them, and after a failover a sentinel or a
node that restarts asks the others and follows the new primary instead of its configuration. (How
the product follows a failover under load is tested elsewhere, on a topology of its own.)
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.sentinel import Sentinel

from tests.deploy.sentinel import SENTINEL_ENV, SENTINELS, read_sentinel_url
from tests.support.deploy.compose_file import load_compose

SERVICES = ("redis", "redis-replica", *SENTINELS)
PASSWORD = SENTINEL_ENV["REDIS_PASSWORD"]
TIMEOUT_S = 30.0
_HOSTS = re.compile(r"(?<![\w/.$-])(redis-replica|redis|sentinel-\d)(?![\w.-])")


def _port(name: str) -> int:
    """The port the service listens on: its container's own."""
    return 26379 if name.startswith("sentinel") else 6379


def _free(address: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


@dataclass
class LocalSentinelProfile:
    """The profile's services as processes: `start`, `kill`, and a client to each."""

    compose: dict[str, Any]
    root: Path
    addresses: dict[str, str] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for _ in range(5):
            base = f"127.{random.randint(20, 250)}.{random.randint(0, 250)}"
            self.addresses = {name: f"{base}.{index + 2}" for index, name in enumerate(SERVICES)}
            if all(_free(address, _port(name)) for name, address in self.addresses.items()):
                return
        pytest.skip(
            "ports 6379 and 26379 are taken on every loopback address tried (a Redis on all addresses?)"
        )

    def script(self, name: str) -> str:
        """The service's start script, its names, secret and /data made local."""
        script = str(self.compose["services"][name]["command"][2])
        folder = self.root / name
        (folder / "data").mkdir(parents=True, exist_ok=True)
        secret = folder / "redis-password"
        secret.write_text(PASSWORD)
        script = script.replace("/run/secrets/redis-password", str(secret))
        script = re.sub(r"(?<![\w/])/data(?![\w-])", str(folder / "data"), script)
        script = script.replace("bind 0.0.0.0", f"bind {self.addresses[name]}")
        return _HOSTS.sub(lambda match: self.addresses[match[1]], script)

    def start(self, name: str) -> None:
        log = (self.root / f"{name}.log").open("ab")
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "SENTINEL_HOSTNAME": self.addresses[name]}
        self.processes[name] = subprocess.Popen(
            ["sh", "-c", self.script(name)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self, name: str) -> None:
        process = self.processes.pop(name)
        # The script's own session: redis-server (which it became) or a redis-cli still asking.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def client(self, name: str) -> redis.Redis:
        port = _port(name)
        # No retries: a wait polls again soon anyway, and a refusal is an answer.
        return redis.Redis(
            self.addresses[name], port, password=PASSWORD, socket_timeout=2, decode_responses=True, retry=None
        )

    def primary_as_sentinels_see_it(self, name: str) -> tuple[str, int] | None:
        try:
            reply = self.client(name).execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "switchboard")
        except redis.RedisError:
            return None
        return None if reply is None else (reply[0], int(reply[1]))

    def wait(self, condition: Callable[[], object], what: str) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while not condition():
            for name, process in self.processes.items():
                assert process.poll() is None, f"{name} exited:\n{(self.root / f'{name}.log').read_text()}"
            if time.monotonic() > deadline:
                pytest.fail(f"waited {TIMEOUT_S:.0f} s for {what}; logs in {self.root}")
            time.sleep(0.05)

    def stop(self) -> None:
        for name in list(self.processes):
            self.kill(name)


@pytest.fixture
def profile(tmp_path: Path) -> Iterator[LocalSentinelProfile]:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("no redis-server here (apt-get install redis-server)")
    local = LocalSentinelProfile(load_compose(SENTINEL_ENV), tmp_path)
    try:
        yield local
    finally:
        local.stop()


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def _sentinels_watch(profile: LocalSentinelProfile, primary: str) -> Callable[[], bool]:
    """Each sentinel watches `primary`, and has heard from its replica (one it could promote)."""

    def check() -> bool:
        for name in SENTINELS:
            try:
                master = profile.client(name).sentinel_master("switchboard")
                replicas = profile.client(name).sentinel_slaves("switchboard")
            except redis.RedisError:
                return False
            if master["ip"] != primary or len(replicas) != 1:
                return False
            (replica,) = replicas
            if replica["is_disconnected"] or replica["info-refresh"] > 5000:
                return False
        return True

    return check


def _linked(client: redis.Redis) -> bool:
    try:
        return client.info("replication").get("master_link_status") == "up"
    except redis.RedisError:
        return False


def test_the_sentinel_profile_runs_fails_over_and_restarts_into_the_new_primary(
    profile: LocalSentinelProfile,
) -> None:
    address = profile.addresses
    profile.start("redis")
    profile.wait(lambda: _answers(profile.client("redis")), "redis")
    profile.start("redis-replica")
    profile.wait(lambda: _linked(profile.client("redis-replica")), "the replica to copy redis")
    for name in SENTINELS:
        profile.start(name)
    profile.wait(_sentinels_watch(profile, address["redis"]), "the sentinels to watch redis and its replica")

    # A client given env.example's URL (the services' names made local) writes through the sentinels.
    url = read_sentinel_url(SENTINEL_ENV["REDIS_URL"])
    sentinel = Sentinel(
        [(address[host], port) for host, port in url.sentinels],
        sentinel_kwargs={"password": url.sentinel_password, "socket_timeout": 2},
        password=url.password,
        socket_timeout=2,
    )
    sentinel.master_for(url.master_name).set("job", "queued")
    assert sentinel.master_for(url.master_name).wait(1, 2000) == 1

    # A failover promotes the replica, with what it copied.
    profile.client("sentinel-1").execute_command("SENTINEL", "FAILOVER", url.master_name)
    promoted = (address["redis-replica"], 6379)
    profile.wait(
        lambda: all(profile.primary_as_sentinels_see_it(name) == promoted for name in SENTINELS),
        "the sentinels to name the replica the primary",
    )
    assert sentinel.master_for(url.master_name, decode_responses=True).get("job") == "queued"
    # A sentinel that restarts (its configuration gone with its tmpfs) asks the others, and watches
    # the new primary at once rather than `redis`.
    profile.kill("sentinel-3")
    profile.start("sentinel-3")
    profile.wait(lambda: profile.primary_as_sentinels_see_it("sentinel-3") is not None, "sentinel-3 to start")
    assert profile.primary_as_sentinels_see_it("sentinel-3") == promoted
    # The new primary, restarted at once, asks the sentinels and stays the primary, its data kept.
    profile.kill("redis-replica")
    profile.start("redis-replica")
    profile.wait(lambda: _answers(profile.client("redis-replica")), "the new primary to come back")
    assert profile.client("redis-replica").info("replication")["role"] == "master"
    assert profile.client("redis-replica").get("job") == "queued"
    # Every node and sentinel asks for the password (the sentinels speak it to each other too).
    for name in SERVICES:
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(address[name], _port(name), socket_timeout=2, retry=None).ping()
