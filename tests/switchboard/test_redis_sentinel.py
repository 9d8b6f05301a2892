"""Clients of a Sentinel-watched Redis follow a failover without being made again (real processes).

Each test starts its own primary, replica and three sentinels on loopback (tests/support/sentinel.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import SSLConnection
from redis.connection import SSLConnection as SyncSSLConnection
from redis.exceptions import RedisError

from switchboard import api_keys, keys, lua
from switchboard.cli import main as cli
from switchboard.redis_conn import blocking_client, is_connection_error, pooled_client, sync_client
from tests.support.sentinel import SentinelTopology

# A kill is noticed after down-after-milliseconds (1 s), then the sentinels elect and promote.
PROMOTION_S = 15.0


@pytest.fixture
def topology() -> Iterator[SentinelTopology]:
    with SentinelTopology() as started:
        yield started


async def replicated(client: aioredis.Redis) -> None:
    """Wait until the replica has every write so far (as a failover test must, to expect them after)."""
    assert await client.execute_command("WAIT", 1, 2000) == 1


async def until_served(call: Callable[[], object], timeout_s: float = PROMOTION_S) -> float:
    """Retry `call` while Redis is unreachable (the sentinels are electing); returns when it succeeded."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await call()  # type: ignore[misc]
            return time.monotonic()
        except RedisError as exc:
            assert is_connection_error(exc), exc  # a failover looks like a Redis that is down, briefly
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def burst(pooled: aioredis.Redis) -> None:
    """64 commands at once on a pool of four connections: they wait for one, none fails, none opens more."""
    ids = await asyncio.gather(*(pooled.client_id() for _ in range(64)))
    assert len(ids) == 64
    assert len(set(ids)) <= 4


async def test_pooled_and_blocking_clients_follow_a_sentinel_failover(topology: SentinelTopology) -> None:
    pooled = pooled_client(topology.url, max_connections=4)
    blocking = blocking_client(topology.url, block_ms=500)
    stream = keys.job_stream("m")
    jobs_waiting = lua.register(pooled, "jobs_waiting")
    try:
        await pooled.xadd(stream, {"job": "1"})
        await replicated(pooled)
        before = await jobs_waiting(keys=[stream], args=[keys.JOB_GROUP, 1])
        assert await blocking.xread({stream: "0"}, block=100)
        await burst(pooled)
        old_port = topology.primary_port()

        topology.failover()
        topology.wait_promoted(old_port)

        # The same clients, on the new primary: the data is there, the script is loaded again there.
        await until_served(pooled.ping)
        assert await jobs_waiting(keys=[stream], args=[keys.JOB_GROUP, 1]) == before
        await until_served(blocking.ping)
        assert await blocking.xread({stream: "0"}, block=100)
        assert (await pooled.info("replication"))["role"] == "master"
        assert topology.primary_port() != old_port
        await pooled.xadd(stream, {"job": "2"})  # writes go to the new primary
        assert await pooled.xlen(stream) == 2
        await burst(pooled)  # the pool is as bounded on the new primary
    finally:
        await blocking.aclose()
        await pooled.aclose()


async def test_a_pipeline_of_scripts_runs_on_a_primary_promoted_after_a_kill(
    topology: SentinelTopology,
) -> None:
    pooled = pooled_client(topology.url, max_connections=4)
    stream = keys.job_stream("m")
    script = lua.register(pooled, "jobs_waiting")
    scripts = lua.ScriptRunner(pooled)
    try:
        await pooled.xadd(stream, {"job": "1"})
        await replicated(pooled)

        def fill(calls: lua.Calls) -> None:
            calls.add(script, [stream], [keys.JOB_GROUP, 1])

        # Four commands at once: the pool holds four connections to the primary, idle after them.
        before = await asyncio.gather(*(scripts.run(fill) for _ in range(4)))
        old = topology.kill_primary()
        topology.wait_promoted(old.port)

        # Every one of those connections is broken: each command reconnects, to the new primary (not
        # to the old address, retried in vain), which never saw the script: the runner loads it on
        # NOSCRIPT and runs that call again. Nothing fails once the sentinels name the new primary.
        after = await asyncio.gather(*(scripts.run(fill) for _ in range(4)))
        assert after == before
    finally:
        await pooled.aclose()


async def test_closing_a_client_closes_its_connections_to_the_sentinels(topology: SentinelTopology) -> None:
    def sentinel_clients() -> int:
        total = 0
        for sentinel in topology.sentinels:
            with topology._sentinel_client(sentinel) as client:
                total += int(client.info("clients")["connected_clients"]) - 1  # less this one
        return total

    before = sentinel_clients()
    pooled = pooled_client(topology.url, max_connections=4)
    blocking = blocking_client(topology.url, block_ms=500)
    await asyncio.gather(pooled.ping(), blocking.ping())
    assert sentinel_clients() > before
    await blocking.aclose()
    await pooled.aclose()
    # A sentinel counts a closed connection out once it has read the close: soon, not at once.
    deadline = time.monotonic() + 5
    while (now := sentinel_clients()) != before:
        assert time.monotonic() < deadline, f"{now - before} connections to the sentinels left open"
        await asyncio.sleep(0.05)


def test_sync_client_and_switchboard_keys_work_through_sentinel(
    topology: SentinelTopology, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "configure_logging", lambda *_, **__: None)
    monkeypatch.setenv("REDIS_URL", topology.url)
    assert cli.main(["keys", "add", "alice"]) == 0
    with sync_client(topology.url, timeout_s=5) as client:
        assert client.execute_command("WAIT", 1, 2000) == 1  # and the client holds a connection
        old = topology.kill_primary()
        topology.wait_promoted(old.port)
        # The same client's broken connection reconnects to the new primary, not to the old address.
        names = [record.name for record in api_keys.KeyStore(client).all()]
    assert names == ["alice"]
    capsys.readouterr()
    assert cli.main(["keys", "list"]) == 0
    assert "alice" in capsys.readouterr().out
    assert cli.main(["keys", "remove", "alice"]) == 0
    with sync_client(topology.url, timeout_s=5) as client:
        assert client.hlen(keys.api_keys()) == 0


async def test_rediss_sentinel_clients_speak_tls_to_the_primary_and_the_sentinels() -> None:
    """No connection is made here: what each client would connect with (a TLS server is not run)."""
    url = "rediss+sentinel://:pw@127.0.0.1:1,127.0.0.1:2/m/0?ssl_cert_reqs=required&ssl_ca_certs=/ca.pem"
    pooled = pooled_client(url, max_connections=4)
    blocking = blocking_client(url, block_ms=500)
    try:
        for client in (pooled, blocking):
            pool = client.connection_pool
            assert issubclass(pool.connection_class, SSLConnection)
            assert pool.connection_kwargs["ssl_ca_certs"] == "/ca.pem"
            sentinels = pool.sentinel_manager.sentinels  # type: ignore[attr-defined]
            for sentinel in sentinels:
                assert issubclass(sentinel.connection_pool.connection_class, SSLConnection)
                assert sentinel.connection_pool.connection_kwargs["password"] is None
    finally:
        await blocking.aclose()
        await pooled.aclose()
    with sync_client(url, timeout_s=1) as client:
        assert issubclass(client.connection_pool.connection_class, SyncSSLConnection)
