"""The private Redis: loopback only, bounded memory, and a clean refusal when it is full."""

from __future__ import annotations

import pytest
import redis
from redis.exceptions import OutOfMemoryError

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
