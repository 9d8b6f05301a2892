"""deploy/k8s: valid Kubernetes objects once composed, consistent with the product, scaled to zero by KEDA."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from switchboard import keys
from switchboard.config import Settings
from tests.support.deploy.compose_file import REPO
from tests.support.deploy.product import cli_command, router_paths, settings_from
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

Object = dict[str, Any]


def compose_kustomization() -> list[Object]:
    """The objects `kubectl apply -k deploy/k8s` applies: resources, with labels and image tags."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
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


def _settings(objects: list[Object], kind: str, name: str, tmp_path: Path) -> Settings:
    """What the container's `switchboard` process runs with: the ConfigMap's file and its variables."""
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
    return settings_from(_environment(container), config_path)


def test_kubectl_kustomize_composes_the_same_objects(manifests: list[Object]) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl here (its `kustomize` would render deploy/k8s)")
    rendered = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, check=True)
    ours = sorted(manifests, key=lambda o: (o["kind"], o["metadata"]["name"]))
    theirs = sorted(yaml.safe_load_all(rendered.stdout), key=lambda o: (o["kind"], o["metadata"]["name"]))
    assert theirs == ours


def test_every_built_in_object_validates_against_the_kubernetes_schema(manifests: list[Object]) -> None:
    kinds = set()
    for document in manifests:
        if document["kind"] in KEDA_KINDS:
            continue
        kinds.add(document["kind"])
        assert kubernetes_schema_path(document["apiVersion"], document["kind"]).is_file()
        validator = kubernetes_validator(document["apiVersion"], document["kind"])
        assert schema_errors(validator, document) == [], document["metadata"]["name"]
    assert kinds == {"ConfigMap", "Service", "Deployment", "StatefulSet", "PodDisruptionBudget"}


def test_the_schema_check_refuses_a_broken_object(manifests: list[Object]) -> None:
    broken = copy.deepcopy(_one(manifests, "Deployment", "switchboard-router"))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/x"
    broken["spec"]["replicas"] = "two"
    errors = schema_errors(kubernetes_validator("apps/v1", "Deployment"), broken)
    assert any("paht" in error for error in errors) and any("replicas" in error for error in errors)


def test_keda_objects_validate_against_the_crd_schema_where_it_is_kept(manifests: list[Object]) -> None:
    folder = SCHEMAS / "keda"
    if not folder.is_dir():
        pytest.skip("KEDA's CRD schemas are not kept here (see tests/deploy/schemas/README.md)")
    from jsonschema import Draft7Validator

    for document in manifests:
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
    args = container["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    data = args[args.index("--dir") + 1]
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert {"name": claim["metadata"]["name"], "mountPath": data} in container["volumeMounts"]
    # Every variable the container gets is used: in its arguments, or by redis-cli in the probes.
    env = _environment(container)
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    assert set(env) == {"REDIS_PASSWORD", "REDISCLI_AUTH"}
    port = args[args.index("--port") + 1]
    for probe in ("readinessProbe", "livenessProbe"):
        assert f"redis-cli -p {port} ping" in container[probe]["exec"]["command"][-1]
    service = _one(manifests, "Service", "switchboard-redis")
    (service_port,) = service["spec"]["ports"]
    # The router and the workers reach Redis where it listens.
    for name in ("switchboard-router", "switchboard-worker"):
        url = _settings(manifests, "Deployment", name, tmp_path).redis.url
        assert url is not None and f"@{service['metadata']['name']}:{service_port['port']}/" in url
    assert str(service_port["port"]) == port


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

    previous = keys.PREFIX
    keys.set_prefix(settings.redis.key_prefix)
    try:
        streams = {keys.job_stream(model.name) for model in settings.models}
    finally:
        keys.set_prefix(previous)
    redis = _one(manifests, "Service", "switchboard-redis")
    (redis_port,) = redis["spec"]["ports"]
    by_stream: dict[str, set[str]] = {}
    for trigger in scaled["triggers"]:
        assert trigger["type"] == "redis-streams"
        metadata = trigger["metadata"]
        assert metadata["address"] == f"{redis['metadata']['name']}:{redis_port['port']}"
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
    assert by_stream == {stream: {"lag", "pending"} for stream in streams}


def test_keda_reads_the_password_redis_is_started_with(manifests: list[Object]) -> None:
    authentication = _one(manifests, "TriggerAuthentication", "switchboard-redis")["spec"]
    (target,) = authentication["secretTargetRef"]
    assert target["parameter"] == "password"
    redis = _container(manifests, "StatefulSet", "switchboard-redis")
    (password,) = [v for v in redis["env"] if v["name"] == "REDIS_PASSWORD"]
    assert password["valueFrom"]["secretKeyRef"] == {"name": target["name"], "key": target["key"]}


def test_images_are_the_ones_deploy_docker_builds(manifests: list[Object]) -> None:
    built = {path.stem for path in (REPO / "deploy" / "docker").glob("*.Dockerfile")}
    for container in _containers(manifests):
        image, _, tag = container["image"].partition(":")
        if image.startswith("switchboard/"):
            assert image.removeprefix("switchboard/") in built and tag
        else:
            assert re.search(r"\d+\.\d+", tag), f"pin {container['image']}"
