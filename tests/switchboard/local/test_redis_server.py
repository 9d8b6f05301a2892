"""The private Redis: loopback only, a password, private files, bounded memory, and a clean refusal
when it is full."""

from __future__ import annotations

import stat
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest
import redis
from redis.exceptions import AuthenticationError, OutOfMemoryError

from switchboard.local.redis_server import DEFAULT_MAXMEMORY, PrivateRedis
from tests.support.network import accepts, connection_refused, non_loopback_ipv4


def test_it_listens_on_loopback_only(redis_server: PrivateRedis) -> None:
    assert accepts("127.0.0.1", redis_server.port)
    address = non_loopback_ipv4()
    assert connection_refused(address, redis_server.port), f"the private Redis is reachable on {address}"


def test_memory_is_bounded_and_nothing_is_evicted(redis_server: PrivateRedis) -> None:
    assert DEFAULT_MAXMEMORY == "1gb"
    with redis.Redis.from_url(redis_server.url) as client:
        settings = client.config_get("maxmemory*")
    assert settings["maxmemory"] == str(1024**3)
    assert settings["maxmemory-policy"] == "noeviction"


def test_a_full_server_refuses_writes_and_keeps_what_it_holds() -> None:
    with PrivateRedis(maxmemory="3mb") as server, redis.Redis.from_url(server.url) as client:
        with pytest.raises(OutOfMemoryError):
            for index in range(1000):
                client.set(f"filler:{index}", b"x" * 100_000)
        assert client.get("filler:0") == b"x" * 100_000


def test_a_client_without_the_password_is_refused(redis_server: PrivateRedis) -> None:
    with redis.Redis(port=redis_server.port) as stranger, pytest.raises(AuthenticationError):
        stranger.keys("*")
    with redis.Redis.from_url(redis_server.url) as client:
        assert client.ping()
    assert redis_server.password not in redis_server.address


def test_the_password_is_on_no_command_line_and_its_files_are_this_users_alone(tmp_path: Path) -> None:
    folder = tmp_path / "redis"
    folder.mkdir(mode=0o755)
    (folder / "appendonlydir").mkdir(mode=0o755)
    left = folder / "appendonlydir" / "old.aof"
    left.write_text("an earlier run's file, world-readable")
    left.chmod(0o644)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a `switchboard up` killed outright, whose Redis ended with it
    stale = Path(tempfile.gettempdir()) / f"switchboard-redis-{gone.pid}-abc"
    stale.mkdir(mode=0o700)
    (stale / "redis.url").write_text("redis://:old-password@127.0.0.1:1/0")
    with PrivateRedis(persist_dir=str(folder)) as server, redis.Redis.from_url(server.url) as client:
        assert not stale.exists()
        client.set("prompt", "something private")
        servers = [p for p in psutil.Process().children(recursive=True) if p.name() == "redis-server"]
        assert any(f":{server.port}" in " ".join(p.cmdline()) for p in servers)
        for process in servers:
            assert server.password not in " ".join(process.cmdline())
        url_file = server.url_file
        assert url_file.read_text().strip() == server.url
        files = [path for path in [*folder.rglob("*"), *url_file.parent.rglob("*")] if path.is_file()]
        assert any(path.suffix == ".aof" and path != left for path in files), files
        for path in [folder, *folder.rglob("*"), url_file.parent, *url_file.parent.iterdir()]:
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    assert not url_file.exists()  # the password's files go with the server
