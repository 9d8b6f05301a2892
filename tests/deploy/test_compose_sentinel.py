"""compose.yaml's `sentinel` profile, read: a replica that follows `redis` with its password and
keeps its own append-only volume, three sentinels watching `redis` under the master name of
env.example's URL with the secret's password, hardened like `redis` (test_compose.py's checks of
every service cover them), and routers and workers reading that URL from their secret file. The
profile run for real: test_compose_sentinel_local.py."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.deploy.compose_services import (
    SWITCHBOARD_SERVICES,
    TRTLLM_CONFIG,
    config_lines,
    redis_config,
    service_redis_url,
    service_settings,
)
from tests.deploy.sentinel import SENTINEL_ENV, SENTINELS, read_sentinel_url
from tests.support.deploy.compose_file import (
    active_services,
    environment,
    load_compose,
    secret_files,
    secret_value,
    volume_mounts,
)
from tests.support.deploy.product import reads_redis_url_file


def _fallback_primary(service: dict[str, Any]) -> tuple[str, int]:
    """The (host, port) a start script uses when no sentinel names the primary."""
    found = re.search(r"^host=(\S+) port=(\d+)$", service["command"][2], re.MULTILINE)
    assert found is not None, "the script starts from a primary of its own"
    return found[1], int(found[2])


def _asks_the_sentinels(service: dict[str, Any], master_name: str) -> list[str]:
    """The sentinels a start script asks for the primary (all of them, in one loop), checked asked
    right: each on the port it listens on, with the password, for `master_name`."""
    script = service["command"][2]
    loop = re.search(r"^\s*for sentinel in ([\w -]+); do$", script, re.MULTILINE)
    assert loop is not None
    assert (
        'REDISCLI_AUTH="$(cat /run/secrets/redis-password)" timeout 3 redis-cli -h "$sentinel" -p 26379 '
        f"--no-auth-warning sentinel get-master-addr-by-name {master_name}" in script
    )
    return loop[1].split()


def test_the_sentinel_profile_adds_a_replica_and_three_sentinels() -> None:
    compose = load_compose(SENTINEL_ENV)
    profiles = set(SENTINEL_ENV["COMPOSE_PROFILES"].split(","))
    added = set(active_services(compose, profiles)) - set(active_services(compose, profiles - {"sentinel"}))
    assert added == {"redis-replica", *SENTINELS}
    # The sentinels reach `redis` by name at their first start: they wait for its health.
    for name in ("redis-replica", *SENTINELS):
        assert compose["services"][name]["depends_on"] == {"redis": {"condition": "service_healthy"}}


def test_the_replica_follows_redis_with_its_password() -> None:
    compose = load_compose(SENTINEL_ENV)
    redis, replica = compose["services"]["redis"], compose["services"]["redis-replica"]
    primary, copy = redis_config(redis), redis_config(replica)
    url = read_sentinel_url(SENTINEL_ENV["REDIS_URL"])
    # It copies `redis` (or whom the sentinels name), on the port `redis` listens on.
    assert _fallback_primary(replica) == ("redis", int(primary["port"]))
    assert primary["port"] in redis["expose"] and copy["port"] in replica["expose"]
    assert sorted(_asks_the_sentinels(replica, url.master_name)) == list(SENTINELS)
    script = replica["command"][2]
    assert 'follow="replicaof $host $port"\n[ "$host" = redis-replica ] && follow=""' in script
    assert "$follow" in copy
    # Each is known by its service's name, and either may be the other's replica after a failover:
    # both ask for the one password and give it to their primary, from the secret's file.
    for name, config in (("redis", primary), ("redis-replica", copy)):
        assert config["replica-announce-ip"] == name
        assert config["requirepass"] == config["masterauth"] == '"$(cat /run/secrets/redis-password)"'
        service = compose["services"][name]
        assert secret_files(compose, service) == {"/run/secrets/redis-password": "redis-password"}
        # Both keep their data on a volume of their own, within the same memory cap.
        assert config["appendonly"] == "yes" and config["maxmemory-policy"] == "noeviction"
        assert config["maxmemory"] == primary["maxmemory"]
        (volume,) = [source for source, target, _ in volume_mounts(service) if target == config["dir"]]
        assert volume in compose["volumes"]
        check = service["healthcheck"]["test"][1]
        assert f"redis-cli -p {config['port']} ping" in check
    assert volume_mounts(redis) != volume_mounts(replica)
    assert replica["deploy"]["resources"]["limits"] == redis["deploy"]["resources"]["limits"]
    assert url.password == secret_value(compose, "redis-password", SENTINEL_ENV)


@pytest.mark.parametrize("name", SENTINELS)
def test_sentinels_watch_redis_under_the_master_name_of_the_url(name: str) -> None:
    compose = load_compose(SENTINEL_ENV)
    sentinel = compose["services"][name]
    config = config_lines(sentinel, "cat > /data/sentinel.conf")
    url = read_sentinel_url(SENTINEL_ENV["REDIS_URL"])
    # The URL names every sentinel where it listens, under the name they watch `redis` by.
    assert url.sentinels == tuple((sentinel, 26379) for sentinel in SENTINELS)
    port = dict(url.sentinels)[name]
    assert f"port {port}" in config and str(port) in sentinel["expose"]
    assert f"redis-cli -p {port} ping" in sentinel["healthcheck"]["test"][1]
    monitor = [line.split() for line in config if line.startswith("sentinel monitor ")]
    assert monitor == [["sentinel", "monitor", url.master_name, "$host", "$port", "2"]]
    redis_port = int(redis_config(compose["services"]["redis"])["port"])
    assert _fallback_primary(sentinel) == ("redis", redis_port)
    # A restarted sentinel asks the two others (not itself) before falling back to `redis`.
    assert sorted(_asks_the_sentinels(sentinel, url.master_name)) == list(SENTINELS)
    assert '[ "$sentinel" = "$SENTINEL_HOSTNAME" ] && continue' in sentinel["command"][2]
    assert len(SENTINELS) // 2 < 2 <= len(SENTINELS)  # a quorum of two: a majority
    # One password, the secret's: the sentinels' own (the URL's sentinel_password) and the primary's.
    assert secret_files(compose, sentinel) == {"/run/secrets/redis-password": "redis-password"}
    assert 'requirepass "$(cat /run/secrets/redis-password)"' in config
    assert f'sentinel auth-pass {url.master_name} "$(cat /run/secrets/redis-password)"' in config
    assert url.sentinel_password == url.password == secret_value(compose, "redis-password", SENTINEL_ENV)
    # Known by its service's name; its configuration, which Sentinel rewrites, on a tmpfs of its own.
    assert environment(sentinel) == {"SENTINEL_HOSTNAME": name}
    assert {"sentinel resolve-hostnames yes", "sentinel announce-hostnames yes"} <= set(config)
    assert "sentinel announce-ip $SENTINEL_HOSTNAME" in config and "dir /data" in config
    tmpfs = {entry.split(":")[0]: entry.partition(":")[2].split(",") for entry in sentinel["tmpfs"]}
    assert f"uid={sentinel['user'].split(':')[0]}" in tmpfs["/data"]
    assert sentinel["command"][2].rstrip().endswith("exec redis-server /data/sentinel.conf --sentinel")


@pytest.mark.parametrize("name", SWITCHBOARD_SERVICES)
def test_routers_and_workers_read_the_sentinel_url_from_its_secret_file(name: str) -> None:
    env = {**SENTINEL_ENV, "SWITCHBOARD_CONFIG": TRTLLM_CONFIG} if name == "worker-trtllm" else SENTINEL_ENV
    compose = load_compose(env)
    assert service_redis_url(compose, name, env) == SENTINEL_ENV["REDIS_URL"]
    settings = service_settings(compose, name, env)  # a URL the product refuses fails here
    if reads_redis_url_file():
        assert settings.redis.url == SENTINEL_ENV["REDIS_URL"]
