"""compose.yaml: valid by the Compose specification, naming only what the product has, hardened."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from switchboard.config import ConfigError, load_settings
from tests.deploy.compose_services import (
    SWITCHBOARD_SERVICES,
    TRTLLM_CONFIG,
    redis_config,
    service_redis_url,
    service_settings,
)
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
from tests.support.deploy.product import cli_command, reads_redis_url_file, router_paths
from tests.support.deploy.schemas import compose_validator, schema_errors
from workers.runtime.metrics_server import MetricsServer

WORKERS = ("worker", "worker-cpu", "worker-trtllm")
GPU_WORKERS = ("worker", "worker-trtllm")
VLLM_WORKERS = ("worker", "worker-cpu")
# Past the drain, a worker still unloads its models and stops Triton before it exits.
STOP_AFTER_DRAIN_S = 30.0
# What .env holds that no command line, container environment or image may show.
SECRETS = ("REDIS_PASSWORD", "REDIS_URL", "GRAFANA_ADMIN_PASSWORD")
CADDYFILE = REPO / "deploy" / "compose" / "Caddyfile"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


def _compose_for(name: str) -> dict[str, Any]:
    """The compose file as a filled-in .env gives it to `name`: the TensorRT-LLM worker with its own
    configuration, as `COMPOSE_PROFILES=trtllm` asks for."""
    if name == "worker-trtllm":
        return load_compose({**EXAMPLE_ENV, "SWITCHBOARD_CONFIG": TRTLLM_CONFIG})
    return load_compose()


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
    assert redis_config(redis)["requirepass"] == '"$(cat /run/secrets/redis-password)"'
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
    settings = service_settings(compose, name)  # every variable is a setting, and reaches it
    assert service_redis_url(compose, name) == f"redis://:{EXAMPLE_ENV['REDIS_PASSWORD']}@redis:6379/0"
    if reads_redis_url_file():
        assert settings.redis.url == service_redis_url(compose, name)
    assert settings.auth.admin_key_sha256 == EXAMPLE_ENV["SWITCHBOARD_ADMIN_KEY_SHA256"]
    assert environment(service)["OTEL_SERVICE_NAME"] == f"switchboard-{args.command}"


def test_the_router_listens_where_the_gateway_and_its_healthcheck_reach_it(compose: dict[str, Any]) -> None:
    router = compose["services"]["router"]
    settings = service_settings(compose, "router")
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
    config = redis_config(redis)
    port = config["port"]
    assert port in redis["expose"] and config["bind"] == "0.0.0.0"
    for name in SWITCHBOARD_SERVICES:
        compose_for = _compose_for(name)
        assert _port_in(service_redis_url(compose_for, name)) == ("redis", int(port))
        if reads_redis_url_file():
            assert service_settings(compose_for, name).redis.url == service_redis_url(compose_for, name)
    # The password Redis asks for is the one in the routers' and workers' URL.
    assert f":{EXAMPLE_ENV['REDIS_PASSWORD']}@" in service_redis_url(compose, "router")
    assert secret_value(compose, "redis-password", EXAMPLE_ENV) == EXAMPLE_ENV["REDIS_PASSWORD"]
    assert environment(redis) == {}
    check = redis["healthcheck"]["test"][1]
    assert f"redis-cli -p {port} ping" in check
    assert 'REDISCLI_AUTH="$(cat /run/secrets/redis-password)"' in check  # redis-cli's own variable


def test_redis_keeps_queued_jobs_on_a_volume_within_a_memory_cap(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    config = redis_config(redis)
    assert config["appendonly"] == "yes"
    assert config["maxmemory-policy"] == "noeviction"
    assert ("redis-data", config["dir"], False) in volume_mounts(redis)
    assert "redis-data" in compose["volumes"]
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    maxmemory = re.fullmatch(r"(\d+)([kmg])b?", config["maxmemory"])
    limit = re.fullmatch(r"(\d+)([kmg])", redis["deploy"]["resources"]["limits"]["memory"])
    assert maxmemory and limit
    assert int(maxmemory[1]) * units[maxmemory[2]] < int(limit[1]) * units[limit[2]]


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
    settings = service_settings(compose, name)
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
    held = service_settings(_compose_for("worker-trtllm"), "worker-trtllm").worker_models()
    assert held and {model.engine_name for model in held} == {"trtllm"}
    # On a configuration without its models, the TensorRT-LLM worker refuses to start, naming them,
    # instead of taking the vLLM models.
    with pytest.raises(
        ConfigError, match=re.escape("worker.models names unknown models: tinyllama-1.1b-trt")
    ):
        service_settings(load_compose(), "worker-trtllm")
    # The default configuration, for the vLLM workers: vLLM models only.
    for name in VLLM_WORKERS:
        held = service_settings(load_compose(), name).worker_models()
        assert held and {model.engine_name for model in held} == {"vllm"}
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
        assert {model.engine_name for model in service_settings(mixed, name).worker_models()} == {engine}


def test_the_trtllm_configuration_serves_its_models_from_the_models_folder() -> None:
    settings = load_settings(REPO / TRTLLM_CONFIG, environ={})
    assert settings.models and all(model.path.startswith("/models/") for model in settings.models)
    for model in settings.models:
        assert model.engine_name == "trtllm"
        # Set where the footprint must be predictable: the KV cache's cap, and the context it serves.
        assert {"max_seq_len", "kv_cache_config"} <= set(model.engine_args)
        assert "max_tokens" in model.engine_args["kv_cache_config"]


async def test_the_trtllm_workers_healthcheck_asks_the_workers_metrics_port() -> None:
    compose = _compose_for("worker-trtllm")
    service = compose["services"]["worker-trtllm"]
    check = service["healthcheck"]["test"]
    url = re.search(r"http://[^'\"]+", " ".join(check))
    assert url is not None and check[:2] == ["CMD", "python"]
    settings = service_settings(compose, "worker-trtllm")
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
    assert target["names"] == ["router"] and target["port"] == service_settings(compose, "router").router.port
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
