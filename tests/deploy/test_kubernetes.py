"""deploy/k8s: valid Kubernetes objects once composed, consistent with the product, scaled to zero by
KEDA, fenced by network policies, with no secret on a command line or in an environment."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from switchboard import keys
from switchboard.config import Settings
from tests.deploy.sentinel import read_sentinel_url
from tests.support.deploy.compose_file import REPO
from tests.support.deploy.product import cli_command, reads_redis_url_file, router_paths, settings_from
from tests.support.deploy.schemas import SCHEMAS, kubernetes_schema_path, kubernetes_validator, schema_errors

K8S = REPO / "deploy" / "k8s"
KEDA_KINDS = {"ScaledObject", "TriggerAuthentication"}
# What the Secret `switchboard-secrets` holds, as the README's Deploying section creates it.
EXAMPLE_SECRET = {
    "redis-password": "examplepassword",
    "redis-url": "redis://:examplepassword@switchboard-redis:6379/0",
    "admin-key-sha256": "0" * 64,
}
STOP_AFTER_DRAIN_S = 30.0
# The namespace the README creates and applies into; KEDA's operator, in a namespace of its own,
# reaches Redis by a name that includes it.
NAMESPACE = "switchboard"
# Redis under Sentinel, as kustomization.yaml's comment says to swap it in: these files in place of
# those, and the Secret's `redis-url` naming the sentinels.
SENTINEL_SWAP = {"redis.yaml": "redis-sentinel.yaml", "worker-scaling.yaml": "worker-scaling-sentinel.yaml"}
SENTINEL_SECRET = {
    **EXAMPLE_SECRET,
    "redis-url": "redis+sentinel://:examplepassword@switchboard-redis-sentinel:26379/switchboard/0"
    "?sentinel_password=examplepassword",
}

Object = dict[str, Any]


def _kustomization(swap: Mapping[str, str] | None = None) -> Object:
    """kustomization.yaml, with the resources `swap` names replaced as its comment says."""
    kustomization: Object = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    swap = swap or {}
    assert set(swap) <= set(kustomization["resources"])
    kustomization["resources"] = [swap.get(resource, resource) for resource in kustomization["resources"]]
    return kustomization


def compose_kustomization(swap: Mapping[str, str] | None = None) -> list[Object]:
    """The objects `kubectl apply -k deploy/k8s` applies: resources, with labels and image tags."""
    kustomization = _kustomization(swap)
    assert set(kustomization) <= {"apiVersion", "kind", "labels", "resources", "images"}, (
        "a kustomize feature this composition does not apply"
    )
    objects = [
        document
        for resource in kustomization["resources"]
        for document in yaml.safe_load_all((K8S / resource).read_text())
        if document
    ]
    for labels in kustomization.get("labels", []):
        assert not labels.get("includeSelectors") and not labels.get("includeTemplates")
        for document in objects:
            document["metadata"].setdefault("labels", {}).update(labels["pairs"])
    tags = {image["name"]: image["newTag"] for image in kustomization.get("images", [])}
    for container in _containers(objects):
        if container["image"] in tags:
            container["image"] = f"{container['image']}:{tags[container['image']]}"
    return objects


def _containers(objects: list[Object]) -> Iterator[Object]:
    for document in objects:
        if document["kind"] in ("Deployment", "StatefulSet"):
            yield from document["spec"]["template"]["spec"]["containers"]


@pytest.fixture(scope="module")
def manifests() -> list[Object]:
    return compose_kustomization()


@pytest.fixture(scope="module")
def sentinel_manifests() -> list[Object]:
    return compose_kustomization(SENTINEL_SWAP)


@pytest.fixture(params=["plain", "sentinel"])
def either_manifests(
    request: pytest.FixtureRequest, manifests: list[Object], sentinel_manifests: list[Object]
) -> list[Object]:
    """The objects of either Redis: plain, or under Sentinel."""
    return sentinel_manifests if request.param == "sentinel" else manifests


def _one(objects: list[Object], kind: str, name: str) -> Object:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _container(objects: list[Object], kind: str, name: str) -> Object:
    (container,) = _one(objects, kind, name)["spec"]["template"]["spec"]["containers"]
    return container


def _environment(container: Object) -> dict[str, str]:
    """The container's variables, with values from the Secret filled in from EXAMPLE_SECRET."""
    env = {}
    for variable in container.get("env", []):
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        else:
            reference = variable["valueFrom"]["secretKeyRef"]
            assert reference["name"] == "switchboard-secrets"
            env[variable["name"]] = EXAMPLE_SECRET[reference["key"]]
    return env


def _secret_files(pod: Object, container: Object) -> dict[str, str]:
    """Container path → key of `switchboard-secrets`, for each file of a Secret volume it mounts."""
    volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
    files = {}
    for mount in container.get("volumeMounts", []):
        secret = volumes.get(mount["name"], {}).get("secret")  # claim templates are no pod volume
        if secret is not None:
            assert secret["secretName"] == "switchboard-secrets"
            for item in secret["items"]:
                files[f"{mount['mountPath']}/{item['path']}"] = item["key"]
    return files


def _settings(
    objects: list[Object], kind: str, name: str, tmp_path: Path, secret: Mapping[str, str] = EXAMPLE_SECRET
) -> Settings:
    """What the container's `switchboard` process runs with: the ConfigMap's file, its variables and
    the Secret's files (written where its variables name them)."""
    pod = _one(objects, kind, name)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = cli_command(container["args"])
    assert args.config is not None
    mount = Path(args.config).parent
    (volume_name,) = [m["name"] for m in container["volumeMounts"] if Path(m["mountPath"]) == mount]
    (volume,) = [v for v in pod["volumes"] if v["name"] == volume_name]
    config_map = _one(objects, "ConfigMap", volume["configMap"]["name"])
    config_path = tmp_path / f"{name}.toml"
    config_path.write_text(config_map["data"][Path(args.config).name])
    variables = _environment(container)
    for path, key in _secret_files(pod, container).items():
        local = tmp_path / f"{name}-{key}"
        local.write_text(secret[key])
        variables = {
            variable: str(local) if value == path else value for variable, value in variables.items()
        }
    return settings_from(variables, config_path)


def _redis_url(objects: list[Object], name: str) -> str:
    """The Redis URL the Deployment's process reads: the Secret's file REDIS_URL_FILE names."""
    pod = _one(objects, "Deployment", name)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return EXAMPLE_SECRET[_secret_files(pod, container)[_environment(container)["REDIS_URL_FILE"]]]


def _script(container: Object) -> str:
    """The shell script a container starts with, as the shell gets it."""
    assert container["args"][:2] == ["sh", "-c"]
    return str(container["args"][2]).replace("$$", "$")  # Kubernetes' escape of `$`


def _config_lines(container: Object, opener: str) -> list[str]:
    """The configuration a start script writes in the here-document that follows `opener`."""
    body = re.search(rf"{re.escape(opener)} <<EOF\n(.*?)\nEOF", _script(container), re.DOTALL)
    assert body is not None, f"no here-document after `{opener}`"
    return [line.strip() for line in body[1].splitlines() if line.strip()]


def _redis_config(container: Object) -> dict[str, str]:
    """Redis's configuration as its command hands it over: on standard input, a here-document."""
    lines = _config_lines(container, "exec redis-server -")
    return dict(line.partition(" ")[::2] for line in lines)


@pytest.mark.parametrize("swap", [None, SENTINEL_SWAP], ids=["plain", "sentinel"])
def test_kubectl_kustomize_composes_the_same_objects(swap: dict[str, str] | None, tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl here (its `kustomize` would render deploy/k8s)")
    folder = tmp_path / "k8s"
    shutil.copytree(K8S, folder)
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(_kustomization(swap)))
    rendered = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, check=True)
    ours = sorted(compose_kustomization(swap), key=lambda o: (o["kind"], o["metadata"]["name"]))
    theirs = sorted(yaml.safe_load_all(rendered.stdout), key=lambda o: (o["kind"], o["metadata"]["name"]))
    assert theirs == ours


def test_every_built_in_object_validates_against_the_kubernetes_schema(
    either_manifests: list[Object],
) -> None:
    kinds = set()
    for document in either_manifests:
        if document["kind"] in KEDA_KINDS:
            continue
        kinds.add(document["kind"])
        assert kubernetes_schema_path(document["apiVersion"], document["kind"]).is_file()
        validator = kubernetes_validator(document["apiVersion"], document["kind"])
        assert schema_errors(validator, document) == [], document["metadata"]["name"]
    assert kinds == {
        "ConfigMap",
        "Service",
        "Deployment",
        "StatefulSet",
        "PodDisruptionBudget",
        "NetworkPolicy",
    }


def test_the_schema_check_refuses_a_broken_object(manifests: list[Object]) -> None:
    broken = copy.deepcopy(_one(manifests, "Deployment", "switchboard-router"))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/x"
    broken["spec"]["replicas"] = "two"
    errors = schema_errors(kubernetes_validator("apps/v1", "Deployment"), broken)
    assert any("paht" in error for error in errors) and any("replicas" in error for error in errors)


def test_keda_objects_validate_against_the_crd_schema_where_it_is_kept(
    either_manifests: list[Object],
) -> None:
    folder = SCHEMAS / "keda"
    if not folder.is_dir():
        pytest.skip("KEDA's CRD schemas are not kept here (see tests/deploy/schemas/README.md)")
    from jsonschema import Draft7Validator

    for document in either_manifests:
        if document["kind"] in KEDA_KINDS:
            schema = yaml.safe_load((folder / f"{document['kind'].lower()}_v1alpha1.json").read_text())
            errors = sorted(Draft7Validator(schema).iter_errors(document), key=str)
            assert [error.message for error in errors] == []


@pytest.mark.parametrize(
    ("kind", "name"), [("Deployment", "switchboard-router"), ("Deployment", "switchboard-worker")]
)
def test_containers_run_real_commands_with_real_settings(
    manifests: list[Object], kind: str, name: str, tmp_path: Path
) -> None:
    container = _container(manifests, kind, name)
    # The image's entrypoint (tini) stays: `command` would replace it, `args` replace its CMD.
    assert "command" not in container
    args = cli_command(container["args"])
    assert args.command == name.removeprefix("switchboard-")
    settings = _settings(manifests, kind, name, tmp_path)
    assert _redis_url(manifests, name) == EXAMPLE_SECRET["redis-url"]
    if reads_redis_url_file():
        assert settings.redis.url == EXAMPLE_SECRET["redis-url"]


def test_probes_reach_real_paths_on_the_port_the_router_listens_on(
    manifests: list[Object], tmp_path: Path
) -> None:
    settings = _settings(manifests, "Deployment", "switchboard-router", tmp_path)
    container = _container(manifests, "Deployment", "switchboard-router")
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert settings.router.host == "0.0.0.0" and ports["http"] == settings.router.port
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] in router_paths() and ports[get["port"]] == settings.router.port
    service = _one(manifests, "Service", "switchboard-router")
    assert [port["targetPort"] for port in service["spec"]["ports"]] == ["http"]
    pod_labels = _one(manifests, "Deployment", "switchboard-router")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def test_redis_is_persistent_password_protected_and_probed(manifests: list[Object], tmp_path: Path) -> None:
    statefulset = _one(manifests, "StatefulSet", "switchboard-redis")
    container = _container(manifests, "StatefulSet", "switchboard-redis")
    config = _redis_config(container)
    assert config["appendonly"] == "yes"
    assert config["maxmemory-policy"] == "noeviction"
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert {"name": claim["metadata"]["name"], "mountPath": config["dir"]} in container["volumeMounts"]
    # The password is read from the Secret's file, by Redis and by redis-cli in the probes.
    files = _secret_files(statefulset["spec"]["template"]["spec"], container)
    (password_file,) = [path for path, key in files.items() if key == "redis-password"]
    assert config["requirepass"] == f'"$(cat {password_file})"'
    assert "env" not in container
    port = config["port"]
    for probe in ("readinessProbe", "livenessProbe"):
        check = container[probe]["exec"]["command"][-1]
        assert f'REDISCLI_AUTH="$(cat {password_file})" redis-cli -p {port} ping' in check
    service = _one(manifests, "Service", "switchboard-redis")
    (service_port,) = service["spec"]["ports"]
    # The router and the workers reach Redis where it listens, with its password.
    for name in ("switchboard-router", "switchboard-worker"):
        url = _redis_url(manifests, name)
        assert (
            f":{EXAMPLE_SECRET['redis-password']}@{service['metadata']['name']}:{service_port['port']}/"
            in url
        )
    assert str(service_port["port"]) == port


def test_no_secret_is_on_a_command_line_or_in_an_environment(either_manifests: list[Object]) -> None:
    for container in _containers(either_manifests):
        for variable in container.get("env", []):
            reference = variable.get("valueFrom", {}).get("secretKeyRef")
            if reference is not None:
                # The admin key's hash is no secret (it cannot be turned back into the key).
                assert reference["key"] == "admin-key-sha256", f"{container['name']}: {variable['name']}"
        words = " ".join(container.get("command", []) + container.get("args", []))
        assert "--requirepass" not in words and "$(REDIS_PASSWORD)" not in words
        assert not [value for value in EXAMPLE_SECRET.values() if value in words]


def test_pod_disruption_budgets_cover_router_and_workers(manifests: list[Object]) -> None:
    budgets = {o["metadata"]["name"]: o["spec"] for o in manifests if o["kind"] == "PodDisruptionBudget"}
    assert set(budgets) == {"switchboard-router", "switchboard-worker"}
    for name, spec in budgets.items():
        pods = _one(manifests, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= pods.items()
    router = _one(manifests, "Deployment", "switchboard-router")
    assert router["spec"]["replicas"] > budgets["switchboard-router"]["minAvailable"]
    assert budgets["switchboard-worker"]["maxUnavailable"] == 1


def test_workers_drain_within_their_grace_period_on_a_gpu(manifests: list[Object], tmp_path: Path) -> None:
    settings = _settings(manifests, "Deployment", "switchboard-worker", tmp_path)
    pod = _one(manifests, "Deployment", "switchboard-worker")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= settings.worker.drain_timeout_s + STOP_AFTER_DRAIN_S
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True and "/dev/shm" in mounts
    assert all(model.path.startswith("/models/") for model in settings.models)


def _job_streams(settings: Settings) -> set[str]:
    """Each model's job stream, under the deployment's key prefix."""
    previous = keys.PREFIX
    keys.set_prefix(settings.redis.key_prefix)
    try:
        return {keys.job_stream(model.name) for model in settings.models}
    finally:
        keys.set_prefix(previous)


def _triggers_by_stream(scaled: Object, settings: Settings, trigger_type: str) -> dict[str, set[str]]:
    """Which triggers (lag, pending) each stream has; every trigger is checked on the way."""
    by_stream: dict[str, set[str]] = {}
    for trigger in scaled["triggers"]:
        assert trigger["type"] == trigger_type
        metadata = trigger["metadata"]
        assert metadata["consumerGroup"] == keys.JOB_GROUP
        assert trigger["authenticationRef"] == {"name": "switchboard-redis"}
        if "lagCount" in metadata:
            assert metadata["activationLagCount"] == "0"  # one waiting job wakes a worker
            by_stream.setdefault(metadata["stream"], set()).add("lag")
        else:
            assert int(metadata["pendingEntriesCount"]) <= settings.worker.max_concurrent_jobs
            by_stream.setdefault(metadata["stream"], set()).add("pending")
        assert all(isinstance(value, str) for value in metadata.values())  # KEDA's metadata is strings
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", trigger["name"])
    return by_stream


def _address_from_keda(service: Object) -> str:
    """Where KEDA's operator, in its own namespace, reaches a Service of ours: by a name that
    includes our namespace (a Service's short name resolves only inside its namespace)."""
    (port,) = service["spec"]["ports"]
    return f"{service['metadata']['name']}.{NAMESPACE}.svc:{port['port']}"


def test_keda_scales_workers_from_zero_on_every_models_job_stream(
    manifests: list[Object], tmp_path: Path
) -> None:
    settings = _settings(manifests, "Deployment", "switchboard-worker", tmp_path)
    worker = _one(manifests, "Deployment", "switchboard-worker")
    scaled = _one(manifests, "ScaledObject", "switchboard-worker")["spec"]
    assert scaled["scaleTargetRef"] == {"name": worker["metadata"]["name"]}
    assert "replicas" not in worker["spec"], "KEDA owns the replica count"
    assert scaled["minReplicaCount"] == 0 and scaled["maxReplicaCount"] >= 1
    assert scaled["fallback"]["replicas"] >= 1  # before any worker made the consumer groups
    assert scaled["cooldownPeriod"] >= max(model.keep_alive_s for model in settings.models)

    by_stream = _triggers_by_stream(scaled, settings, "redis-streams")
    assert by_stream == {stream: {"lag", "pending"} for stream in _job_streams(settings)}
    redis = _address_from_keda(_one(manifests, "Service", "switchboard-redis"))
    assert {trigger["metadata"]["address"] for trigger in scaled["triggers"]} == {redis}
    assert f"kubectl create namespace {NAMESPACE}" in (REPO / "README.md").read_text()


def _password_file(container: Object, config_line: str) -> str:
    """The file a `... "$(cat FILE)"` line of a start command reads its password from."""
    found = re.search(r"\$\(cat (\S+)\)", config_line)
    assert found is not None, config_line
    return found[1]


def test_keda_reads_the_password_redis_is_started_with(manifests: list[Object]) -> None:
    authentication = _one(manifests, "TriggerAuthentication", "switchboard-redis")["spec"]
    (target,) = authentication["secretTargetRef"]
    assert target["parameter"] == "password"
    pod = _one(manifests, "StatefulSet", "switchboard-redis")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    files = _secret_files(pod, container)
    password_file = _password_file(container, _redis_config(container)["requirepass"])
    assert (target["name"], target["key"]) == ("switchboard-secrets", files[password_file])


def _sentinel_config(container: Object) -> list[str]:
    return _config_lines(container, "cat > /data/sentinel.conf")


def _fallback_primary(container: Object) -> tuple[str, str]:
    """The (host, port) a start script uses when no sentinel names the primary."""
    found = re.search(r'^host="([^"]+)" port=(\d+)$', _script(container), re.MULTILINE)
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
    readme = (REPO / "README.md").read_text()
    assert SENTINEL_SECRET["redis-url"].replace("examplepassword", "$REDIS_PASSWORD") in readme
    # The same objects but for Redis and the triggers; the ScaledObject differs only in them.
    swapped = {"switchboard-redis", "switchboard-redis-sentinel"}

    def others(objects: list[Object]) -> list[Object]:
        kept = [o for o in objects if o["metadata"]["name"] not in swapped and o["kind"] != "ScaledObject"]
        return sorted(kept, key=lambda o: (o["kind"], o["metadata"]["name"]))

    assert others(sentinel_manifests) == others(manifests)
    plain = copy.deepcopy(_one(manifests, "ScaledObject", "switchboard-worker"))
    sentinel = copy.deepcopy(_one(sentinel_manifests, "ScaledObject", "switchboard-worker"))
    plain_triggers, sentinel_triggers = plain["spec"].pop("triggers"), sentinel["spec"].pop("triggers")
    assert sentinel == plain
    for ours, theirs in zip(sentinel_triggers, plain_triggers, strict=True):
        assert {k: v for k, v in ours["metadata"].items() if k not in ("addresses", "sentinelMaster")} == {
            k: v for k, v in theirs["metadata"].items() if k != "address"
        }
        assert (ours["name"], ours["authenticationRef"]) == (theirs["name"], theirs["authenticationRef"])


def test_redis_under_sentinel_is_a_persistent_primary_and_replica(sentinel_manifests: list[Object]) -> None:
    manifests = sentinel_manifests
    statefulset = _one(manifests, "StatefulSet", "switchboard-redis")
    service = _one(manifests, "Service", "switchboard-redis")
    # Two pods, each with its own name (a headless governing Service that names pods still loading).
    assert statefulset["spec"]["replicas"] == 2
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    container = _container(manifests, "StatefulSet", "switchboard-redis")
    _downward_namespace(container)
    config = _redis_config(container)
    assert config["appendonly"] == "yes" and config["maxmemory-policy"] == "noeviction"
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert {"name": claim["metadata"]["name"], "mountPath": config["dir"]} in container["volumeMounts"]
    # One password, from the Secret's file: asked of clients, and given to the primary it copies.
    files = _secret_files(statefulset["spec"]["template"]["spec"], container)
    for key in ("requirepass", "masterauth"):
        assert files[_password_file(container, config[key])] == "redis-password"
    # It follows the first pod, or whom the sentinels name; known by its own pod name.
    port = config["port"]
    assert _fallback_primary(container) == (_pod_name(statefulset, 0), port)
    assert config["replica-announce-ip"] == "$me"
    script = _script(container)
    assert 'me="$HOSTNAME.switchboard-redis.$NAMESPACE.svc"' in script
    assert 'follow="replicaof $host $port"\n[ "$host" = "$me" ] && follow=""' in script
    assert "$follow" in config
    sentinels = _one(manifests, "Service", "switchboard-redis-sentinel")
    (sentinel_port,) = sentinels["spec"]["ports"]
    assert (
        f"redis-cli -h {sentinels['metadata']['name']} -p {sentinel_port['port']} --no-auth-warning "
        "sentinel get-master-addr-by-name switchboard" in script
    )
    (service_port,) = service["spec"]["ports"]
    assert str(service_port["port"]) == port


def test_sentinels_watch_the_primary_under_the_name_the_url_gives(sentinel_manifests: list[Object]) -> None:
    manifests = sentinel_manifests
    statefulset = _one(manifests, "StatefulSet", "switchboard-redis-sentinel")
    service = _one(manifests, "Service", "switchboard-redis-sentinel")
    redis = _one(manifests, "StatefulSet", "switchboard-redis")
    container = _container(manifests, "StatefulSet", "switchboard-redis-sentinel")
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
    redis_port = _redis_config(_container(manifests, "StatefulSet", "switchboard-redis"))["port"]
    assert _fallback_primary(container) == (_pod_name(redis, 0), redis_port)
    # Where the clients reach them: the URL's one address, the Service on the sentinels' port.
    (service_port,) = service["spec"]["ports"]
    port = {p["name"]: p["containerPort"] for p in container["ports"]}[service_port["targetPort"]]
    assert f"port {port}" in config and service_port["port"] == port
    assert url.sentinels == ((service["metadata"]["name"], service_port["port"]),)
    # One password, from the Secret's file: the sentinels' own and the primary's, as in the URL.
    files = _secret_files(statefulset["spec"]["template"]["spec"], container)
    (requirepass,) = [line for line in config if line.startswith("requirepass ")]
    (auth_pass,) = [line for line in config if line.startswith(f"sentinel auth-pass {url.master_name} ")]
    for line in (requirepass, auth_pass):
        assert files[_password_file(container, line)] == "redis-password"
    assert url.password == url.sentinel_password == SENTINEL_SECRET["redis-password"]
    # Known by name, not by a pod's address; the configuration they rewrite is in a writable volume.
    assert {"sentinel resolve-hostnames yes", "sentinel announce-hostnames yes"} <= set(config)
    assert "sentinel announce-ip $HOSTNAME.switchboard-redis-sentinel.$NAMESPACE.svc" in config
    volumes = {v["name"]: v for v in statefulset["spec"]["template"]["spec"]["volumes"]}
    (data,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/data"]
    assert "emptyDir" in volumes[data["name"]] and not data.get("readOnly")
    assert "dir /data" in config and _script(container).rstrip().endswith(
        "exec redis-server /data/sentinel.conf --sentinel"
    )


@pytest.mark.parametrize("name", ["switchboard-redis", "switchboard-redis-sentinel"])
def test_redis_and_sentinels_are_hardened_probed_and_budgeted(
    sentinel_manifests: list[Object], name: str
) -> None:
    statefulset = _one(sentinel_manifests, "StatefulSet", name)
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
    files = _secret_files(pod, container)
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
    script = _script(_container(sentinel_manifests, "StatefulSet", name))
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
    script = _script(container).replace("/run/secrets/redis/redis-password", str(tmp_path / "password"))
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
    container = _container(sentinel_manifests, "StatefulSet", "switchboard-redis")
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
    container = _container(sentinel_manifests, "StatefulSet", "switchboard-redis-sentinel")
    config = _run_start_script(container, tmp_path, "switchboard-redis-sentinel-2", sentinels_say)
    assert f"sentinel monitor switchboard {watches} 2" in config
    assert "sentinel announce-ip switchboard-redis-sentinel-2.switchboard-redis-sentinel.ns.svc" in config
    assert f'sentinel auth-pass switchboard "{EXAMPLE_SECRET["redis-password"]}"' in config


def test_routers_and_workers_read_the_sentinel_url_from_the_secret(
    sentinel_manifests: list[Object], tmp_path: Path
) -> None:
    for name in ("switchboard-router", "switchboard-worker"):
        settings = _settings(sentinel_manifests, "Deployment", name, tmp_path, SENTINEL_SECRET)
        if reads_redis_url_file():
            assert settings.redis.url == SENTINEL_SECRET["redis-url"]


def test_keda_follows_the_primary_through_the_sentinels(
    sentinel_manifests: list[Object], tmp_path: Path
) -> None:
    manifests = sentinel_manifests
    settings = _settings(manifests, "Deployment", "switchboard-worker", tmp_path)
    scaled = _one(manifests, "ScaledObject", "switchboard-worker")["spec"]
    by_stream = _triggers_by_stream(scaled, settings, "redis-sentinel-streams")
    assert by_stream == {stream: {"lag", "pending"} for stream in _job_streams(settings)}
    url = read_sentinel_url(SENTINEL_SECRET["redis-url"])
    sentinels = _address_from_keda(_one(manifests, "Service", "switchboard-redis-sentinel"))
    for trigger in scaled["triggers"]:
        assert trigger["metadata"]["addresses"] == sentinels
        assert trigger["metadata"]["sentinelMaster"] == url.master_name
    # Both passwords, Redis's and the sentinels', from the Secret's key both are started with.
    authentication = _one(manifests, "TriggerAuthentication", "switchboard-redis")["spec"]
    targets = {target["parameter"]: target for target in authentication["secretTargetRef"]}
    assert set(targets) == {"password", "sentinelPassword"}
    for parameter, name, line in (
        ("password", "switchboard-redis", "requirepass "),
        ("sentinelPassword", "switchboard-redis-sentinel", "requirepass "),
    ):
        statefulset = _one(manifests, "StatefulSet", name)
        (container,) = statefulset["spec"]["template"]["spec"]["containers"]
        files = _secret_files(statefulset["spec"]["template"]["spec"], container)
        script_line = re.search(rf"^\s*{line}.*$", _script(container), re.MULTILINE)
        assert script_line is not None
        key = files[_password_file(container, script_line[0])]
        assert (targets[parameter]["name"], targets[parameter]["key"]) == ("switchboard-secrets", key)


def test_images_are_the_ones_deploy_docker_builds(manifests: list[Object]) -> None:
    built = {path.stem for path in (REPO / "deploy" / "docker").glob("*.Dockerfile")}
    for container in _containers(manifests):
        image, _, tag = container["image"].partition(":")
        if image.startswith("switchboard/"):
            assert image.removeprefix("switchboard/") in built and tag
        else:
            assert re.search(r"\d+\.\d+", tag), f"pin {container['image']}"


def _policies(manifests: list[Object]) -> list[Object]:
    return [document for document in manifests if document["kind"] == "NetworkPolicy"]


def _selects(policy: Object, labels: dict[str, str]) -> bool:
    selector = policy["spec"]["podSelector"]
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are read here"
    return selector.get("matchLabels", {}).items() <= labels.items()


def _pod_labels(manifests: list[Object]) -> dict[str, dict[str, str]]:
    return {
        document["metadata"]["name"]: document["spec"]["template"]["metadata"]["labels"]
        for document in manifests
        if document["kind"] in ("Deployment", "StatefulSet")
    }


def _peers(policy: Object, direction: str) -> list[tuple[Object, list[Object]]]:
    """(peer, ports) of each rule of a policy, `from` for ingress, `to` for egress."""
    side = "from" if direction == "ingress" else "to"
    return [
        (peer, rule.get("ports", []))
        for rule in policy["spec"].get(direction, [])
        for peer in rule.get(side, [{}])  # a rule with no peers allows every peer
    ]


def test_everything_is_denied_unless_a_policy_allows_it(either_manifests: list[Object]) -> None:
    manifests = either_manifests
    policies = _policies(manifests)
    deny = [
        policy
        for policy in policies
        if policy["spec"]["podSelector"] == {}
        and set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        and not policy["spec"].get("ingress")
        and not policy["spec"].get("egress")
    ]
    assert len(deny) == 1, "one default-deny policy selects every pod of the namespace"
    for name, labels in _pod_labels(manifests).items():
        own = [policy for policy in policies if policy["spec"]["podSelector"] and _selects(policy, labels)]
        assert len(own) == 1, f"{name}: one policy of its own says what it may do"
        assert set(own[0]["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    # DNS, for every pod, and nothing else in that policy.
    (dns,) = [policy for policy in policies if policy["metadata"]["name"] == "switchboard-dns"]
    assert dns["spec"]["podSelector"] == {} and dns["spec"]["policyTypes"] == ["Egress"]
    ((peer, ports),) = [(peer, ports) for peer, ports in _peers(dns, "egress")]
    assert peer["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    assert {(port["protocol"], port["port"]) for port in ports} == {("UDP", 53), ("TCP", 53)}


def _own_policy(manifests: list[Object], name: str) -> Object:
    labels = _pod_labels(manifests)[name]
    (policy,) = [p for p in _policies(manifests) if p["spec"]["podSelector"] and _selects(p, labels)]
    return policy


def _named(peer: Object) -> str:
    """Who a peer is: a pod of this namespace by its name label, or a namespace by its name."""
    if "namespaceSelector" in peer:
        assert "podSelector" not in peer
        return "namespace " + peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
    return peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"]


def _named_ports(manifests: list[Object]) -> dict[str, dict[str, int]]:
    """Pod name → its container's named ports, for every Deployment and StatefulSet."""
    return {
        document["metadata"]["name"]: {
            port["name"]: port["containerPort"]
            for container in document["spec"]["template"]["spec"]["containers"]
            for port in container.get("ports", [])
        }
        for document in manifests
        if document["kind"] in ("Deployment", "StatefulSet")
    }


def _allowed(manifests: list[Object], policy: Object, direction: str) -> set[tuple[str, int]]:
    """(peer, port number) a policy allows; named ports are the selected pods' own (ingress)."""
    ports = _named_ports(manifests)
    selected = [name for name, labels in _pod_labels(manifests).items() if _selects(policy, labels)]
    found = set()
    for peer, peer_ports in _peers(policy, direction):
        assert peer_ports, "every rule names its ports"
        for port in peer_ports:
            number = port["port"]
            if isinstance(number, str):
                assert direction == "ingress", "egress rules name port numbers"
                numbers = {ports[name][number] for name in selected}
                if not numbers:
                    continue  # no pod here has that port (the sentinels' rules without Sentinel)
                (number,) = numbers
            found.add((_named(peer), number))
    return found


def test_each_pod_talks_only_to_whom_it_must(either_manifests: list[Object]) -> None:
    manifests = either_manifests
    policies = {
        name: next(p for p in _policies(manifests) if p["metadata"]["name"] == name)
        for name in (
            "switchboard-router",
            "switchboard-worker",
            "switchboard-redis",
            "switchboard-redis-sentinel",
        )
    }

    def allowed(name: str, direction: str) -> set[tuple[str, int]]:
        return _allowed(manifests, policies[name], direction)

    redis_out = {("switchboard-redis", 6379), ("switchboard-redis-sentinel", 26379)}
    # The router: requests from the ingress controller, scrapes from Prometheus; out, Redis alone
    # (under Sentinel, the sentinels first).
    router_port = _named_ports(manifests)["switchboard-router"]["http"]
    assert allowed("switchboard-router", "ingress") == {
        ("namespace ingress-nginx", router_port),
        ("namespace monitoring", router_port),
    }
    assert allowed("switchboard-router", "egress") == redis_out
    # Workers: only Prometheus' scrapes of the metrics port in; out, Redis alone.
    assert allowed("switchboard-worker", "ingress") == {
        ("namespace monitoring", _named_ports(manifests)["switchboard-worker"]["metrics"])
    }
    assert allowed("switchboard-worker", "egress") == redis_out
    # Redis: the router, the workers and KEDA's operator in; under Sentinel, the sentinels and the
    # other Redis pod too; out, only the other Redis pod and the sentinels.
    clients = {"switchboard-router", "switchboard-worker", "namespace keda"}
    assert allowed("switchboard-redis", "ingress") == {
        (client, 6379) for client in clients | {"switchboard-redis-sentinel", "switchboard-redis"}
    }
    assert allowed("switchboard-redis", "egress") == redis_out
    # The sentinels (their rules select no pod without Sentinel): asked by the clients, the Redis
    # pods and each other; out, the Redis pods and each other.
    if "switchboard-redis-sentinel" in _pod_labels(manifests):
        assert allowed("switchboard-redis-sentinel", "ingress") == {
            (client, 26379) for client in clients | {"switchboard-redis", "switchboard-redis-sentinel"}
        }
    assert allowed("switchboard-redis-sentinel", "egress") == redis_out


def _lets_through(manifests: list[Object], client: str, server: str, port: int) -> bool:
    """Whether the policies let `client` (a pod's name, or `namespace X`) reach `server` on `port`:
    the client's own policy lets it out (when it is ours), the server's lets it in."""
    labels = _pod_labels(manifests)
    inbound = _allowed(manifests, _own_policy(manifests, server), "ingress")
    if client.startswith("namespace "):
        return (client, port) in inbound
    outbound = _allowed(manifests, _own_policy(manifests, client), "egress")
    server_name = labels[server]["app.kubernetes.io/name"]
    client_name = labels[client]["app.kubernetes.io/name"]
    return (server_name, port) in outbound and (client_name, port) in inbound


def test_the_traffic_sentinel_needs_is_let_through(sentinel_manifests: list[Object]) -> None:
    manifests = sentinel_manifests
    sentinel, redis = "switchboard-redis-sentinel", "switchboard-redis"
    needed = [
        # The clients ask the sentinels for the primary, then use it.
        *[
            (client, server)
            for client in ("switchboard-router", "switchboard-worker", "namespace keda")
            for server in (sentinel, redis)
        ],
        (sentinel, redis),  # watching, and reconfiguring at a failover
        (sentinel, sentinel),  # hellos, votes
        (redis, redis),  # a replica copies its primary
        (redis, sentinel),  # a starting pod asks which pod is the primary
    ]
    ports = _named_ports(manifests)
    for client, server in needed:
        port = ports[server]["sentinel" if server == sentinel else "redis"]
        assert _lets_through(manifests, client, server, port), f"{client} cannot reach {server}:{port}"
    # And nothing else reaches them: not the ingress controller, not Prometheus.
    for outsider in ("namespace ingress-nginx", "namespace monitoring"):
        assert not _lets_through(manifests, outsider, sentinel, ports[sentinel]["sentinel"])
        assert not _lets_through(manifests, outsider, redis, ports[redis]["redis"])


def test_the_ingress_example_serves_the_router_over_tls(manifests: list[Object]) -> None:
    ingress = yaml.safe_load((K8S / "ingress.yaml").read_text())
    assert schema_errors(kubernetes_validator(ingress["apiVersion"], ingress["kind"]), ingress) == []
    spec = ingress["spec"]
    (tls,) = spec["tls"]
    (rule,) = spec["rules"]
    assert rule["host"] in tls["hosts"] and tls["secretName"]
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/force-ssl-redirect"] == "true"
    (path,) = rule["http"]["paths"]
    service = _one(manifests, "Service", "switchboard-router")
    backend = path["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"]["name"] in {port["name"] for port in service["spec"]["ports"]}
    # The ingress controller's namespace is the one the router's policy lets in.
    controller = "namespace ingress-nginx"
    assert controller in {
        _named(peer) for peer, _ in _peers(_own_policy(manifests, "switchboard-router"), "ingress")
    }
