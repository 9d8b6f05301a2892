"""compose.yaml: valid by the Compose specification, naming only what the product has, hardened."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from switchboard.config import ConfigError, Settings, load_settings
from tests.deploy.sentinel import SENTINEL_ENV, SENTINELS, read_sentinel_url
from tests.support.deploy.compose_file import (
    EXAMPLE_ENV,
    REPO,
    InterpolationError,
    active_services,
    duration_s,
    environment,
    load_compose,
    raw_compose,
    secret_files,
    secret_value,
    volume_mounts,
)
from tests.support.deploy.product import cli_command, reads_redis_url_file, router_paths, settings_from
from tests.support.deploy.schemas import compose_validator, schema_errors
from workers.runtime.metrics_server import MetricsServer

SWITCHBOARD_SERVICES = ("router", "worker", "worker-cpu", "worker-trtllm")
WORKERS = ("worker", "worker-cpu", "worker-trtllm")
GPU_WORKERS = ("worker", "worker-trtllm")
VLLM_WORKERS = ("worker", "worker-cpu")
TRTLLM_CONFIG = "./deploy/compose/switchboard-trtllm.toml"
# Past the drain, a worker still unloads its models and stops Triton before it exits.
STOP_AFTER_DRAIN_S = 30.0
# What .env holds that no command line, container environment or image may show.
SECRETS = ("REDIS_PASSWORD", "REDIS_URL", "GRAFANA_ADMIN_PASSWORD")
CADDYFILE = REPO / "deploy" / "compose" / "Caddyfile"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


def _config_source(compose: dict[str, Any], service: dict[str, Any], container_path: str) -> Path:
    """The host file compose mounts at `container_path` in the service (one of its `configs`)."""
    for config in service.get("configs", []):
        if config["target"] == container_path:
            return REPO / compose["configs"][config["source"]]["file"]
    pytest.fail(f"nothing is mounted at {container_path}")


def _compose_for(name: str) -> dict[str, Any]:
    """The compose file as a filled-in .env gives it to `name`: the TensorRT-LLM worker with its own
    configuration, as `COMPOSE_PROFILES=trtllm` asks for."""
    if name == "worker-trtllm":
        return load_compose({**EXAMPLE_ENV, "SWITCHBOARD_CONFIG": TRTLLM_CONFIG})
    return load_compose()


def _settings(compose: dict[str, Any], name: str, env: Mapping[str, str] = EXAMPLE_ENV) -> Settings:
    """What the service's `switchboard` process runs with: its config file, its environment and the
    secrets mounted for it (written where its variables name them, as the container has them)."""
    service = compose["services"][name]
    args = cli_command(service["command"])
    assert args.config is not None, f"{name} runs without --config"
    with tempfile.TemporaryDirectory() as folder:
        variables = environment(service)
        for target, secret in secret_files(compose, service).items():
            local = Path(folder) / Path(target).name
            local.write_text(secret_value(compose, secret, env))
            variables = {key: str(local) if value == target else value for key, value in variables.items()}
        return settings_from(variables, _config_source(compose, service, str(args.config)))


def _redis_url(compose: dict[str, Any], name: str, env: Mapping[str, str] = EXAMPLE_ENV) -> str:
    """The Redis URL the service's process reads: the secret mounted where REDIS_URL_FILE points."""
    service = compose["services"][name]
    mounted = secret_files(compose, service)
    return secret_value(compose, mounted[environment(service)["REDIS_URL_FILE"]], env)


def _config_lines(service: dict[str, Any], opener: str) -> list[str]:
    """The configuration a service's start script writes in the here-document that follows `opener`."""
    assert service["command"][:2] == ["sh", "-c"]
    body = re.search(rf"{re.escape(opener)} <<EOF\n(.*?)\nEOF", service["command"][2], re.DOTALL)
    assert body is not None, f"no here-document after `{opener}`"
    return [line.strip() for line in body[1].splitlines() if line.strip()]


def _redis_config(redis: dict[str, Any]) -> dict[str, str]:
    """Redis's configuration as its command hands it over: on standard input, a here-document."""
    return dict(line.partition(" ")[::2] for line in _config_lines(redis, "exec redis-server -"))


def _port_in(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname and parts.port, url
    return parts.hostname, parts.port


def test_the_compose_file_validates_against_the_compose_specification(compose: dict[str, Any]) -> None:
    assert schema_errors(compose_validator(), raw_compose()) == []
    assert schema_errors(compose_validator(), compose) == []


def test_the_schema_check_refuses_what_compose_refuses(compose: dict[str, Any]) -> None:
    broken = yaml.safe_load(yaml.safe_dump(compose))
    broken["services"]["router"]["stop_grace_period_s"] = 30
    broken["services"]["redis"]["healthcheck"]["interval"] = 5  # a duration is a string
    errors = schema_errors(compose_validator(), broken)
    assert any("stop_grace_period_s" in error for error in errors), errors
    assert any("interval" in error for error in errors), errors


def test_secrets_must_come_from_the_environment_file() -> None:
    env = {name: value for name, value in EXAMPLE_ENV.items() if name != "SWITCHBOARD_ADMIN_KEY_SHA256"}
    with pytest.raises(InterpolationError, match="SWITCHBOARD_ADMIN_KEY_SHA256"):
        load_compose(env)
    text = (REPO / "compose.yaml").read_text()
    for name in SECRETS:
        assert EXAMPLE_ENV[name] not in text
    # Every secret compose hands over is one of .env's variables, named (empty) in env.example.
    example = (REPO / "deploy" / "compose" / "env.example").read_text()
    sources = {secret["environment"] for secret in raw_compose()["secrets"].values()}
    assert sources == set(SECRETS)
    for name in sources:
        assert re.search(rf"^{name}=", example, re.MULTILINE), f"env.example does not name {name}"
    assert re.search(r"^REDIS_PASSWORD=$", example, re.MULTILINE)
    assert re.search(r"^GRAFANA_ADMIN_PASSWORD=$", example, re.MULTILINE), "no default password"
    for name in SWITCHBOARD_SERVICES:
        env = environment(raw_compose()["services"][name])
        assert "REDIS_URL" not in env
        assert env["SWITCHBOARD_AUTH__ADMIN_KEY_SHA256"].startswith("${SWITCHBOARD_ADMIN_KEY_SHA256:?")


def _strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [text for item in node for text in _strings(item)]
    if isinstance(node, dict):
        return [text for item in node.values() for text in _strings(item)]
    return [str(node)]


@pytest.mark.parametrize("name", sorted(raw_compose()["services"]))
def test_no_secret_is_on_a_command_line_or_in_an_environment(compose: dict[str, Any], name: str) -> None:
    service = compose["services"][name]
    shown = _strings(
        [service.get(key) for key in ("command", "entrypoint", "environment", "labels", "healthcheck")]
    )
    for secret in SECRETS:
        assert not [text for text in shown if EXAMPLE_ENV[secret] in text], f"{name} shows {secret}"
    assert not [text for text in shown if "requirepass" in text and "/run/secrets/" not in text]
    assert "REDISCLI_AUTH" not in environment(service)


def test_secrets_are_mounted_as_files_where_their_readers_look(compose: dict[str, Any]) -> None:
    for name in SWITCHBOARD_SERVICES:
        mounted = secret_files(compose, compose["services"][name])
        assert mounted[environment(compose["services"][name])["REDIS_URL_FILE"]] == "redis-url"
    redis = compose["services"]["redis"]
    assert secret_files(compose, redis) == {"/run/secrets/redis-password": "redis-password"}
    assert _redis_config(redis)["requirepass"] == '"$(cat /run/secrets/redis-password)"'
    grafana = compose["services"]["grafana"]
    password_file = environment(grafana)["GF_SECURITY_ADMIN_PASSWORD__FILE"]
    assert secret_files(compose, grafana) == {password_file: "grafana-admin-password"}
    assert secret_value(compose, "redis-url", EXAMPLE_ENV) == EXAMPLE_ENV["REDIS_URL"]


@pytest.mark.parametrize("name", SWITCHBOARD_SERVICES)
def test_each_service_runs_a_real_command_with_real_settings(name: str) -> None:
    compose = _compose_for(name)
    service = compose["services"][name]
    args = cli_command(service["command"])
    assert args.command == ("router" if name == "router" else "worker")
    settings = _settings(compose, name)  # every variable is a setting, and reaches it
    assert _redis_url(compose, name) == f"redis://:{EXAMPLE_ENV['REDIS_PASSWORD']}@redis:6379/0"
    if reads_redis_url_file():
        assert settings.redis.url == _redis_url(compose, name)
    assert settings.auth.admin_key_sha256 == EXAMPLE_ENV["SWITCHBOARD_ADMIN_KEY_SHA256"]
    assert environment(service)["OTEL_SERVICE_NAME"] == f"switchboard-{args.command}"


def test_the_router_listens_where_the_gateway_and_its_healthcheck_reach_it(compose: dict[str, Any]) -> None:
    router = compose["services"]["router"]
    settings = _settings(compose, "router")
    assert settings.router.host == "0.0.0.0"
    assert str(settings.router.port) in router["expose"]
    assert "ports" not in router, "replicas of the router cannot share a host port"

    check = router["healthcheck"]["test"]
    url = re.search(r"http://[^'\"]+", " ".join(check))
    assert url is not None and check[:2] == ["CMD", "python"]
    host, port = _port_in(url.group())
    assert (host, port) == ("127.0.0.1", settings.router.port)
    assert urlsplit(url.group()).path in router_paths()

    caddyfile = (REPO / compose["configs"]["caddyfile"]["file"]).read_text()
    upstream = re.search(r"dynamic a \{\s*name (\S+)\s*port (\d+)", caddyfile)
    assert upstream is not None
    assert (upstream[1], int(upstream[2])) == ("router", settings.router.port)
    gateway = compose["services"]["gateway"]
    ready = gateway["healthcheck"]["test"][-1]
    health_site = re.search(r"^http://127\.0\.0\.1:(\d+) \{(.*?)^\}", caddyfile, re.MULTILINE | re.DOTALL)
    assert health_site is not None and "handle /readyz" in health_site[2]
    assert _port_in(ready) == ("127.0.0.1", int(health_site[1]))
    assert urlsplit(ready).path == "/readyz" and "/readyz" in router_paths()


def test_the_gateway_serves_tls_and_plain_http_only_redirects(compose: dict[str, Any]) -> None:
    caddyfile = CADDYFILE.read_text()
    https_port = re.search(r"^\s*https_port (\d+)$", caddyfile, re.MULTILINE)
    http_port = re.search(r"^\s*http_port (\d+)$", caddyfile, re.MULTILINE)
    assert https_port and http_port
    gateway = compose["services"]["gateway"]
    published = {port.split(":")[-1]: port.split(":")[0] for port in gateway["ports"]}
    assert published == {https_port[1]: "443", http_port[1]: "80"}
    sites = dict(re.findall(r"^(\S+) \{(.*?)^\}", caddyfile, re.MULTILINE | re.DOTALL))
    (tls_site,) = [body for address, body in sites.items() if address.startswith("https://")]
    assert re.search(r"^\s*tls \{\$SWITCHBOARD_TLS:internal\}$", tls_site, re.MULTILINE)
    assert "import routers" in tls_site
    # Plain HTTP on the published port: a redirect to HTTPS, nothing else.
    assert sites["http://"].split() == ["redir", "https://{host}:{$SWITCHBOARD_HTTPS_PORT:443}{uri}", "308"]
    assert environment(gateway)["SWITCHBOARD_HTTPS_PORT"] == published.get(https_port[1]) == "443"
    # The only other site listens on the container's loopback (the health check), unpublished.
    others = set(sites) - {"{", "(routers)", "http://"} - {a for a in sites if a.startswith("https://")}
    assert others == {"http://127.0.0.1:8081"} and "bind 127.0.0.1" in sites["http://127.0.0.1:8081"]


def test_caddy_accepts_the_caddyfile_and_serves_only_redirects_in_clear() -> None:
    caddy = shutil.which("caddy")
    if caddy is None:
        pytest.skip("no caddy here (apt-get install caddy) to adapt the Caddyfile")
    adapted = subprocess.run(
        [caddy, "adapt", "--config", str(CADDYFILE), "--adapter", "caddyfile"],
        capture_output=True,
        text=True,
        check=True,
    )
    servers = json.loads(adapted.stdout)["apps"]["http"]["servers"]
    by_listen = {tuple(server["listen"]): server for server in servers.values()}
    assert set(by_listen) == {(":8443",), (":8080",), ("127.0.0.1:8081",)}
    clear = by_listen[(":8080",)]["routes"]
    handlers = [handler for route in clear for handler in route["handle"]]
    assert handlers == [
        {
            "handler": "static_response",
            "headers": {"Location": ["https://{http.request.host}:443{http.request.uri}"]},
            "status_code": 308,
        }
    ]


def test_everyone_reaches_redis_where_it_listens(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    config = _redis_config(redis)
    port = config["port"]
    assert port in redis["expose"] and config["bind"] == "0.0.0.0"
    for name in SWITCHBOARD_SERVICES:
        compose_for = _compose_for(name)
        assert _port_in(_redis_url(compose_for, name)) == ("redis", int(port))
        if reads_redis_url_file():
            assert _settings(compose_for, name).redis.url == _redis_url(compose_for, name)
    # The password Redis asks for is the one in the routers' and workers' URL.
    assert f":{EXAMPLE_ENV['REDIS_PASSWORD']}@" in _redis_url(compose, "router")
    assert secret_value(compose, "redis-password", EXAMPLE_ENV) == EXAMPLE_ENV["REDIS_PASSWORD"]
    assert environment(redis) == {}
    check = redis["healthcheck"]["test"][1]
    assert f"redis-cli -p {port} ping" in check
    assert 'REDISCLI_AUTH="$(cat /run/secrets/redis-password)"' in check  # redis-cli's own variable


def test_redis_keeps_queued_jobs_on_a_volume_within_a_memory_cap(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    config = _redis_config(redis)
    assert config["appendonly"] == "yes"
    assert config["maxmemory-policy"] == "noeviction"
    assert ("redis-data", config["dir"], False) in volume_mounts(redis)
    assert "redis-data" in compose["volumes"]
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    maxmemory = re.fullmatch(r"(\d+)([kmg])b?", config["maxmemory"])
    limit = re.fullmatch(r"(\d+)([kmg])", redis["deploy"]["resources"]["limits"]["memory"])
    assert maxmemory and limit
    assert int(maxmemory[1]) * units[maxmemory[2]] < int(limit[1]) * units[limit[2]]


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
    primary, copy = _redis_config(redis), _redis_config(replica)
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
    config = _config_lines(sentinel, "cat > /data/sentinel.conf")
    url = read_sentinel_url(SENTINEL_ENV["REDIS_URL"])
    # The URL names every sentinel where it listens, under the name they watch `redis` by.
    assert url.sentinels == tuple((sentinel, 26379) for sentinel in SENTINELS)
    port = dict(url.sentinels)[name]
    assert f"port {port}" in config and str(port) in sentinel["expose"]
    assert f"redis-cli -p {port} ping" in sentinel["healthcheck"]["test"][1]
    monitor = [line.split() for line in config if line.startswith("sentinel monitor ")]
    assert monitor == [["sentinel", "monitor", url.master_name, "$host", "$port", "2"]]
    redis_port = int(_redis_config(compose["services"]["redis"])["port"])
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
    assert _redis_url(compose, name, env) == SENTINEL_ENV["REDIS_URL"]
    settings = _settings(compose, name, env)  # a URL the product refuses fails here
    if reads_redis_url_file():
        assert settings.redis.url == SENTINEL_ENV["REDIS_URL"]


@pytest.mark.parametrize("name", sorted(raw_compose()["services"]))
def test_every_service_is_hardened_and_limited(compose: dict[str, Any], name: str) -> None:
    service = compose["services"][name]
    assert service.get("cap_drop") == ["ALL"] and not service.get("cap_add")
    assert "no-new-privileges:true" in service.get("security_opt", [])
    assert service.get("read_only") is True and not service.get("privileged")
    limits = service.get("deploy", {}).get("resources", {}).get("limits", {})
    assert float(limits["cpus"]) > 0 and limits["memory"] and int(limits["pids"]) > 0, limits
    # A read-only root: writes go to volumes or memory, each named.
    writable = {target for _, target, readonly in volume_mounts(service) if not readonly}
    writable |= {entry.split(":")[0] for entry in service.get("tmpfs", [])}
    assert "/tmp" in writable
    assert service.get("network_mode") != "host" and service.get("pid") != "host"


@pytest.mark.parametrize("name", WORKERS)
def test_workers_keep_what_their_engines_need(name: str) -> None:
    worker = _compose_for(name)["services"][name]
    assert worker["shm_size"] == "2gb"  # PyTriton's tensors
    tmpfs = {entry.split(":")[0]: entry.partition(":")[2].split(",") for entry in worker["tmpfs"]}
    # Compiled kernels are loaded back from these: not `noexec`, Docker's default for a tmpfs.
    assert "exec" in tmpfs["/tmp"] and "exec" in tmpfs["/home/switchboard"]
    assert "uid=10001" in tmpfs["/home/switchboard"]  # the images' user
    assert ("model-cache", "/home/switchboard/.cache", False) in volume_mounts(worker)


def test_start_order_waits_for_health(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        depends_on = service.get("depends_on") or {}
        if isinstance(depends_on, list):  # the short form: started, not healthy
            continue
        for dependency, condition in depends_on.items():
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{name} waits on {dependency}'s health"
    for name in SWITCHBOARD_SERVICES:
        assert services[name]["depends_on"]["redis"] == {"condition": "service_healthy"}
    assert services["gateway"]["depends_on"]["router"] == {"condition": "service_healthy"}


@pytest.mark.parametrize("name", WORKERS)
def test_workers_scale_and_drain_within_their_grace_period(name: str) -> None:
    compose = _compose_for(name)
    worker = compose["services"][name]
    assert "container_name" not in worker and "ports" not in worker
    mounts = volume_mounts(worker)
    assert ("model-cache", "/home/switchboard/.cache", False) in mounts
    assert "model-cache" in compose["volumes"]
    models = [(source, readonly) for source, target, readonly in mounts if target == "/models"]
    assert models == [("./models", True)]
    settings = _settings(compose, name)
    assert all(model.path.startswith("/models/") for model in settings.models)
    grace_s = duration_s(worker["stop_grace_period"])
    assert grace_s >= settings.worker.drain_timeout_s + STOP_AFTER_DRAIN_S
    assert worker["init"] is True  # SIGTERM reaches the worker, which ends Triton and its engines


def test_the_gpu_workers_reserve_a_gpu_and_the_cpu_worker_none(compose: dict[str, Any]) -> None:
    for name in GPU_WORKERS:
        devices = compose["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert "reservations" not in compose["services"]["worker-cpu"]["deploy"]["resources"]
    for profiles, expected in (
        ({"gpu"}, ["worker"]),
        ({"cpu"}, ["worker-cpu"]),
        ({"trtllm"}, ["worker-trtllm"]),
        ({"gpu", "trtllm"}, ["worker", "worker-trtllm"]),
    ):
        started = active_services(compose, profiles)
        assert [name for name in started if name in WORKERS] == expected
        assert {"redis", "router", "gateway"} <= set(started)


def test_each_kind_of_worker_holds_only_the_models_of_its_engine(tmp_path: Path) -> None:
    # The TensorRT-LLM configuration, alone: every model its worker may hold is a TensorRT-LLM one.
    held = _settings(_compose_for("worker-trtllm"), "worker-trtllm").worker_models()
    assert held and {model.engine for model in held} == {"trtllm"}
    # On a configuration without its models, the TensorRT-LLM worker refuses to start, naming them,
    # instead of taking the vLLM models.
    with pytest.raises(
        ConfigError, match=re.escape("worker.models names unknown models: tinyllama-1.1b-trt")
    ):
        _settings(load_compose(), "worker-trtllm")
    # The default configuration, for the vLLM workers: vLLM models only.
    for name in VLLM_WORKERS:
        held = _settings(load_compose(), name).worker_models()
        assert held and {model.engine for model in held} == {"vllm"}
    # Both kinds on one configuration: each worker told its models in .env.
    both = tmp_path / "both.toml"
    both.write_text(
        '[[models]]\nname = "v"\npath = "/models/v"\n\n'
        '[[models]]\nname = "t"\npath = "/models/t"\nengine = "trtllm"\n'
    )
    env = {
        **EXAMPLE_ENV,
        "SWITCHBOARD_CONFIG": str(both),
        "SWITCHBOARD_VLLM_MODELS": '["v"]',
        "SWITCHBOARD_TRTLLM_MODELS": '["t"]',
    }
    mixed = load_compose(env)
    for name, engine in (("worker", "vllm"), ("worker-cpu", "vllm"), ("worker-trtllm", "trtllm")):
        assert {model.engine for model in _settings(mixed, name).worker_models()} == {engine}


def test_the_trtllm_configuration_serves_its_models_from_the_models_folder() -> None:
    settings = load_settings(REPO / TRTLLM_CONFIG, environ={})
    assert settings.models and all(model.path.startswith("/models/") for model in settings.models)
    for model in settings.models:
        assert model.engine == "trtllm"
        # Set where the footprint must be predictable: the KV cache's cap, and the context it serves.
        assert {"max_seq_len", "kv_cache_config"} <= set(model.engine_args)
        assert "max_tokens" in model.engine_args["kv_cache_config"]


async def test_the_trtllm_workers_healthcheck_asks_the_workers_metrics_port() -> None:
    compose = _compose_for("worker-trtllm")
    service = compose["services"]["worker-trtllm"]
    check = service["healthcheck"]["test"]
    url = re.search(r"http://[^'\"]+", " ".join(check))
    assert url is not None and check[:2] == ["CMD", "python"]
    settings = _settings(compose, "worker-trtllm")
    assert _port_in(url.group()) == ("127.0.0.1", settings.worker.metrics_port)
    assert settings.worker.metrics_host == "0.0.0.0"
    # The path is one the worker's metrics server answers 200 on.
    server = MetricsServer("127.0.0.1", 0, triton_metrics_url=lambda: None)
    port = await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET {urlsplit(url.group()).path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
        status = (await reader.readline()).decode()
        writer.close()
    finally:
        await server.stop()
    assert status.split()[1] == "200", status
    # Importing TensorRT-LLM at start is slow: the check does not count the first minutes.
    assert duration_s(service["healthcheck"]["start_period"]) >= 120


def test_the_observability_profile_is_wired_end_to_end(compose: dict[str, Any]) -> None:
    services = compose["services"]
    observability = set(active_services(compose, {"observability"})) - set(active_services(compose, set()))
    assert observability == {"otel-collector", "jaeger", "prometheus", "grafana"}

    host, port = _port_in(environment(services["router"])["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert host == "otel-collector" and str(port) in services[host]["expose"]
    collector = yaml.safe_load((REPO / compose["configs"]["otel-collector"]["file"]).read_text())
    assert collector["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(f":{port}")
    jaeger_host, jaeger_port = collector["exporters"]["otlp/jaeger"]["endpoint"].split(":")
    assert str(jaeger_port) in services[jaeger_host]["expose"]

    prometheus = yaml.safe_load((REPO / compose["configs"]["prometheus"]["file"]).read_text())
    (router_job,) = [job for job in prometheus["scrape_configs"] if job["job_name"] == "switchboard-router"]
    (target,) = router_job["dns_sd_configs"]
    assert target["names"] == ["router"] and target["port"] == _settings(compose, "router").router.port
    if router_job["metrics_path"] not in router_paths():
        pytest.skip("the front door serves no /metrics yet: the scrape finds nothing until it does")


def test_grafana_provisions_the_dashboards_folder(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    mounts = {target: Path(source) for source, target, _ in volume_mounts(grafana)}
    provisioning = REPO / mounts["/etc/grafana/provisioning"]
    provider = yaml.safe_load((provisioning / "dashboards" / "dashboards.yaml").read_text())
    (dashboards,) = provider["providers"]
    folder = dashboards["options"]["path"]
    assert mounts[folder] == Path("./deploy/grafana/dashboards") and (REPO / mounts[folder]).is_dir()
    home = environment(grafana)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(home).parent == Path(folder)
    sources = yaml.safe_load((provisioning / "datasources" / "datasources.yaml").read_text())
    for source in sources["datasources"]:
        host, port = _port_in(source["url"])
        published = [p.rsplit(":", 1)[-1] for p in compose["services"][host]["ports"]]
        assert str(port) in published


def test_grafana_has_no_default_login_and_no_anonymous_access(compose: dict[str, Any]) -> None:
    env = environment(compose["services"]["grafana"])
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env  # only the __FILE form: from the secret
    assert env["GF_SECURITY_ADMIN_PASSWORD__FILE"].startswith("/run/secrets/")
    assert raw_compose()["secrets"]["grafana-admin-password"] == {"environment": "GRAFANA_ADMIN_PASSWORD"}
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert env["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert "GF_AUTH_ANONYMOUS_ORG_ROLE" not in env
    # Published on the host's loopback only.
    assert all(port.startswith("127.0.0.1:") for port in compose["services"]["grafana"]["ports"])


def test_docker_compose_config_accepts_the_file(tmp_path: Path) -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client here")
    plugin = subprocess.run([docker, "compose", "version"], capture_output=True, text=True)
    if plugin.returncode != 0:
        pytest.skip(f"docker has no compose plugin here: {plugin.stderr.strip() or plugin.stdout.strip()}")
    env_file = tmp_path / "example.env"
    env_file.write_text("".join(f"{name}={value}\n" for name, value in EXAMPLE_ENV.items()))
    for profiles in (["gpu"], ["cpu", "observability"], ["gpu", "trtllm"], ["gpu", "sentinel"]):
        flags = [arg for profile in profiles for arg in ("--profile", profile)]
        result = subprocess.run(
            [docker, "compose", "--env-file", str(env_file), *flags, "config", "--quiet"],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr
