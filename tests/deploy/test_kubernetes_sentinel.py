"""deploy/k8s with Redis under Sentinel (redis-sentinel.yaml, worker-scaling-sentinel.yaml swapped in):
a persistent primary and replica, three sentinels watching it under the master name the clients'
URL gives, KEDA following the primary through them, start scripts that follow the primary the
sentinels name, every pod hardened and budgeted, and nothing else changed."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path

import pytest

from tests.deploy.kubernetes_objects import (
    EXAMPLE_SECRET,
    K8S,
    SENTINEL_SECRET,
    SENTINEL_SWAP,
    Object,
    address_from_keda,
    config_lines,
    container_settings,
    job_streams,
    one_container,
    one_object,
    password_file_of,
    redis_config,
    secret_files,
    start_script,
    triggers_by_stream,
)
from tests.deploy.sentinel import read_sentinel_url
from tests.support.deploy.compose_file import REPO
from tests.support.deploy.product import reads_redis_url_file


def _sentinel_config(container: Object) -> list[str]:
    return config_lines(container, "cat > /data/sentinel.conf")


def _fallback_primary(container: Object) -> tuple[str, str]:
    """The (host, port) a start script uses when no sentinel names the primary."""
    found = re.search(r'^host="([^"]+)" port=(\d+)$', start_script(container), re.MULTILINE)
    assert found is not None, "the script starts from a primary of its own"
    return found[1], found[2]


def _pod_name(statefulset: Object, index: int) -> str:
    """The stable name of a StatefulSet's pod: <pod>.<governing Service>.<namespace>.svc."""
    name, service = statefulset["metadata"]["name"], statefulset["spec"]["serviceName"]
    return f"{name}-{index}.{service}.$NAMESPACE.svc"


def _downward_namespace(container: Object) -> None:
    (variable,) = [v for v in container["env"] if v["name"] == "NAMESPACE"]
    assert variable["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_the_sentinel_variant_is_what_kustomization_yaml_says_to_swap_in(
    manifests: list[Object], sentinel_manifests: list[Object]
) -> None:
    comment = (K8S / "kustomization.yaml").read_text()
    for plain, sentinel in SENTINEL_SWAP.items():
        assert f"{sentinel} in place of {plain}" in comment
    assert SENTINEL_SECRET["redis-url"].replace("examplepassword", "PASSWORD") in comment
    operations = (REPO / "docs" / "operations.md").read_text()
    assert SENTINEL_SECRET["redis-url"].replace("examplepassword", "$REDIS_PASSWORD") in operations
    # The same objects but for Redis and the triggers; the ScaledObject differs only in them.
    swapped = {"switchboard-redis", "switchboard-redis-sentinel"}

    def others(objects: list[Object]) -> list[Object]:
        kept = [o for o in objects if o["metadata"]["name"] not in swapped and o["kind"] != "ScaledObject"]
        return sorted(kept, key=lambda o: (o["kind"], o["metadata"]["name"]))

    assert others(sentinel_manifests) == others(manifests)
    plain = copy.deepcopy(one_object(manifests, "ScaledObject", "switchboard-worker"))
    sentinel = copy.deepcopy(one_object(sentinel_manifests, "ScaledObject", "switchboard-worker"))
    plain_triggers, sentinel_triggers = plain["spec"].pop("triggers"), sentinel["spec"].pop("triggers")
    assert sentinel == plain
    for ours, theirs in zip(sentinel_triggers, plain_triggers, strict=True):
        assert {k: v for k, v in ours["metadata"].items() if k not in ("addresses", "sentinelMaster")} == {
            k: v for k, v in theirs["metadata"].items() if k != "address"
        }
        assert (ours["name"], ours["authenticationRef"]) == (theirs["name"], theirs["authenticationRef"])


def test_redis_under_sentinel_is_a_persistent_primary_and_replica(sentinel_manifests: list[Object]) -> None:
    manifests = sentinel_manifests
    statefulset = one_object(manifests, "StatefulSet", "switchboard-redis")
    service = one_object(manifests, "Service", "switchboard-redis")
    # Two pods, each with its own name (a headless governing Service that names pods still loading).
    assert statefulset["spec"]["replicas"] == 2
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    container = one_container(manifests, "StatefulSet", "switchboard-redis")
    _downward_namespace(container)
    config = redis_config(container)
    assert config["appendonly"] == "yes" and config["maxmemory-policy"] == "noeviction"
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert {"name": claim["metadata"]["name"], "mountPath": config["dir"]} in container["volumeMounts"]
    # One password, from the Secret's file: asked of clients, and given to the primary it copies.
    files = secret_files(statefulset["spec"]["template"]["spec"], container)
    for key in ("requirepass", "masterauth"):
        assert files[password_file_of(container, config[key])] == "redis-password"
    # It follows the first pod, or whom the sentinels name; known by its own pod name.
    port = config["port"]
    assert _fallback_primary(container) == (_pod_name(statefulset, 0), port)
    assert config["replica-announce-ip"] == "$me"
    script = start_script(container)
    assert 'me="$HOSTNAME.switchboard-redis.$NAMESPACE.svc"' in script
    assert 'follow="replicaof $host $port"\n[ "$host" = "$me" ] && follow=""' in script
    assert "$follow" in config
    sentinels = one_object(manifests, "Service", "switchboard-redis-sentinel")
    (sentinel_port,) = sentinels["spec"]["ports"]
    assert (
        f"redis-cli -h {sentinels['metadata']['name']} -p {sentinel_port['port']} --no-auth-warning "
        "sentinel get-master-addr-by-name switchboard" in script
    )
    (service_port,) = service["spec"]["ports"]
    assert str(service_port["port"]) == port


def test_sentinels_watch_the_primary_under_the_name_the_url_gives(sentinel_manifests: list[Object]) -> None:
    manifests = sentinel_manifests
    statefulset = one_object(manifests, "StatefulSet", "switchboard-redis-sentinel")
    service = one_object(manifests, "Service", "switchboard-redis-sentinel")
    redis = one_object(manifests, "StatefulSet", "switchboard-redis")
    container = one_container(manifests, "StatefulSet", "switchboard-redis-sentinel")
    _downward_namespace(container)
    config = _sentinel_config(container)
    url = read_sentinel_url(SENTINEL_SECRET["redis-url"])
    # Three sentinels, two of which must agree; under the master name the clients' URL gives.
    replicas = statefulset["spec"]["replicas"]
    assert replicas == 3 and statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    monitor = [line.split() for line in config if line.startswith("sentinel monitor ")]
    assert monitor == [["sentinel", "monitor", url.master_name, "$host", "$port", "2"]]
    assert replicas // 2 < 2 <= replicas
    # Whom they watch: the first Redis pod, or whom the other sentinels name.
    redis_port = redis_config(one_container(manifests, "StatefulSet", "switchboard-redis"))["port"]
    assert _fallback_primary(container) == (_pod_name(redis, 0), redis_port)
    # Where the clients reach them: the URL's one address, the Service on the sentinels' port.
    (service_port,) = service["spec"]["ports"]
    port = {p["name"]: p["containerPort"] for p in container["ports"]}[service_port["targetPort"]]
    assert f"port {port}" in config and service_port["port"] == port
    assert url.sentinels == ((service["metadata"]["name"], service_port["port"]),)
    # One password, from the Secret's file: the sentinels' own and the primary's, as in the URL.
    files = secret_files(statefulset["spec"]["template"]["spec"], container)
    (requirepass,) = [line for line in config if line.startswith("requirepass ")]
    (auth_pass,) = [line for line in config if line.startswith(f"sentinel auth-pass {url.master_name} ")]
    for line in (requirepass, auth_pass):
        assert files[password_file_of(container, line)] == "redis-password"
    assert url.password == url.sentinel_password == SENTINEL_SECRET["redis-password"]
    # Known by name, not by a pod's address; the configuration they rewrite is in a writable volume.
    assert {"sentinel resolve-hostnames yes", "sentinel announce-hostnames yes"} <= set(config)
    assert "sentinel announce-ip $HOSTNAME.switchboard-redis-sentinel.$NAMESPACE.svc" in config
    volumes = {v["name"]: v for v in statefulset["spec"]["template"]["spec"]["volumes"]}
    (data,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/data"]
    assert "emptyDir" in volumes[data["name"]] and not data.get("readOnly")
    assert "dir /data" in config and start_script(container).rstrip().endswith(
        "exec redis-server /data/sentinel.conf --sentinel"
    )


@pytest.mark.parametrize("name", ["switchboard-redis", "switchboard-redis-sentinel"])
def test_redis_and_sentinels_are_hardened_probed_and_budgeted(
    sentinel_manifests: list[Object], name: str
) -> None:
    statefulset = one_object(sentinel_manifests, "StatefulSet", name)
    pod = statefulset["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    assert "env" not in container or all(
        "secretKeyRef" not in v.get("valueFrom", {}) for v in container["env"]
    )
    # Probed with the password from the Secret's file, on the port it listens on.
    files = secret_files(pod, container)
    (password_file,) = [path for path, key in files.items() if key == "redis-password"]
    (port,) = [p["containerPort"] for p in container["ports"]]
    for probe in ("readinessProbe", "livenessProbe"):
        check = container[probe]["exec"]["command"][-1]
        assert f'REDISCLI_AUTH="$(cat {password_file})" redis-cli -p {port} ping' in check
    # A drain never takes the last copy of the data, nor the sentinels' quorum.
    (budget,) = [
        o for o in sentinel_manifests if o["kind"] == "PodDisruptionBudget" and o["metadata"]["name"] == name
    ]
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    replicas = statefulset["spec"]["replicas"]
    available = budget["spec"].get("minAvailable", replicas - budget["spec"].get("maxUnavailable", replicas))
    assert available >= (2 if name == "switchboard-redis-sentinel" else 1)


@pytest.mark.parametrize("name", ["switchboard-redis", "switchboard-redis-sentinel"])
def test_the_start_scripts_are_shell_the_shell_reads(sentinel_manifests: list[Object], name: str) -> None:
    script = start_script(one_container(sentinel_manifests, "StatefulSet", name))
    checked = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    # Sentinel's command ends in its configuration; Redis's reads it from standard input.
    assert script.rstrip().endswith(("\nEOF", "exec redis-server /data/sentinel.conf --sentinel"))


def _run_start_script(container: Object, tmp_path: Path, pod: str, sentinels_say: str | None) -> list[str]:
    """The configuration a pod's start script hands to redis-server, run here with stand-ins for
    redis-cli (the sentinels answer `sentinels_say`, "host port", or nothing; every node answers a
    ping) and redis-server (which only keeps the configuration it is given)."""
    bin_dir, data = tmp_path / "bin", tmp_path / "data"
    bin_dir.mkdir(exist_ok=True)
    data.mkdir(exist_ok=True)
    (tmp_path / "password").write_text(EXAMPLE_SECRET["redis-password"])
    kept = tmp_path / "config"
    stand_ins = {
        "redis-cli": 'case "$*" in *get-master-addr-by-name*) [ -n "$SAY" ] && printf "%s\\n%s\\n" $SAY ;; '
        "*ping*) echo PONG ;; esac",
        "redis-server": f'if [ "$1" = - ]; then cat > {kept}; else cp "$1" {kept}; fi',
    }
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    script = start_script(container).replace("/run/secrets/redis/redis-password", str(tmp_path / "password"))
    script = re.sub(r"(?<![\w/])/data(?![\w-])", str(data), script)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOSTNAME": pod, "NAMESPACE": "ns", "SAY": sentinels_say or ""}
    subprocess.run(["sh", "-c", script], env=env, check=True, timeout=10)
    return [line.strip() for line in kept.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("pod", "sentinels_say", "follows"),
    [
        # The first start: no sentinel answers; the first pod is the primary, the second its replica.
        ("switchboard-redis-0", None, None),
        ("switchboard-redis-1", None, "switchboard-redis-0.switchboard-redis.ns.svc 6379"),
        # After a failover the sentinels name the second pod: the first, restarted, follows it, and
        # the second, restarted, stays the primary.
        (
            "switchboard-redis-0",
            "switchboard-redis-1.switchboard-redis.ns.svc 6379",
            "switchboard-redis-1.switchboard-redis.ns.svc 6379",
        ),
        ("switchboard-redis-1", "switchboard-redis-1.switchboard-redis.ns.svc 6379", None),
    ],
)
def test_a_redis_pod_follows_whom_the_sentinels_name(
    sentinel_manifests: list[Object], tmp_path: Path, pod: str, sentinels_say: str | None, follows: str | None
) -> None:
    container = one_container(sentinel_manifests, "StatefulSet", "switchboard-redis")
    config = _run_start_script(container, tmp_path, pod, sentinels_say)
    assert [line for line in config if line.startswith("replicaof")] == (
        [f"replicaof {follows}"] if follows else []
    )
    assert f"replica-announce-ip {pod}.switchboard-redis.ns.svc" in config
    assert f'requirepass "{EXAMPLE_SECRET["redis-password"]}"' in config


@pytest.mark.parametrize(
    ("sentinels_say", "watches"),
    [
        (None, "switchboard-redis-0.switchboard-redis.ns.svc 6379"),
        (
            "switchboard-redis-1.switchboard-redis.ns.svc 6379",
            "switchboard-redis-1.switchboard-redis.ns.svc 6379",
        ),
    ],
)
def test_a_sentinel_watches_whom_the_other_sentinels_name(
    sentinel_manifests: list[Object], tmp_path: Path, sentinels_say: str | None, watches: str
) -> None:
    container = one_container(sentinel_manifests, "StatefulSet", "switchboard-redis-sentinel")
    config = _run_start_script(container, tmp_path, "switchboard-redis-sentinel-2", sentinels_say)
    assert f"sentinel monitor switchboard {watches} 2" in config
    assert "sentinel announce-ip switchboard-redis-sentinel-2.switchboard-redis-sentinel.ns.svc" in config
    assert f'sentinel auth-pass switchboard "{EXAMPLE_SECRET["redis-password"]}"' in config


def test_routers_and_workers_read_the_sentinel_url_from_the_secret(
    sentinel_manifests: list[Object], tmp_path: Path
) -> None:
    for name in ("switchboard-router", "switchboard-worker"):
        settings = container_settings(sentinel_manifests, "Deployment", name, tmp_path, SENTINEL_SECRET)
        if reads_redis_url_file():
            assert settings.redis.url == SENTINEL_SECRET["redis-url"]


def test_keda_follows_the_primary_through_the_sentinels(
    sentinel_manifests: list[Object], tmp_path: Path
) -> None:
    manifests = sentinel_manifests
    settings = container_settings(manifests, "Deployment", "switchboard-worker", tmp_path)
    scaled = one_object(manifests, "ScaledObject", "switchboard-worker")["spec"]
    by_stream = triggers_by_stream(scaled, settings, "redis-sentinel-streams")
    assert by_stream == {stream: {"lag", "pending"} for stream in job_streams(settings)}
    url = read_sentinel_url(SENTINEL_SECRET["redis-url"])
    sentinels = address_from_keda(one_object(manifests, "Service", "switchboard-redis-sentinel"))
    for trigger in scaled["triggers"]:
        assert trigger["metadata"]["addresses"] == sentinels
        assert trigger["metadata"]["sentinelMaster"] == url.master_name
    # Both passwords, Redis's and the sentinels', from the Secret's key both are started with.
    authentication = one_object(manifests, "TriggerAuthentication", "switchboard-redis")["spec"]
    targets = {target["parameter"]: target for target in authentication["secretTargetRef"]}
    assert set(targets) == {"password", "sentinelPassword"}
    for parameter, name, line in (
        ("password", "switchboard-redis", "requirepass "),
        ("sentinelPassword", "switchboard-redis-sentinel", "requirepass "),
    ):
        statefulset = one_object(manifests, "StatefulSet", name)
        (container,) = statefulset["spec"]["template"]["spec"]["containers"]
        files = secret_files(statefulset["spec"]["template"]["spec"], container)
        script_line = re.search(rf"^\s*{line}.*$", start_script(container), re.MULTILINE)
        assert script_line is not None
        key = files[password_file_of(container, script_line[0])]
        assert (targets[parameter]["name"], targets[parameter]["key"]) == ("switchboard-secrets", key)
