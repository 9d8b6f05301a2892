"""deploy/k8s: valid Kubernetes objects once composed (with plain Redis or Redis under Sentinel),
consistent with the product, scaled to zero by KEDA, with no secret on a command line or in an
environment. Network policies: test_kubernetes_policies.py; the Sentinel variant's own checks:
test_kubernetes_sentinel.py."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.kubernetes_objects import (
    EXAMPLE_SECRET,
    K8S,
    KEDA_KINDS,
    NAMESPACE,
    SENTINEL_SWAP,
    Object,
    address_from_keda,
    all_containers,
    compose_kustomization,
    container_settings,
    deployment_redis_url,
    job_streams,
    one_container,
    one_object,
    password_file_of,
    redis_config,
    secret_files,
    swapped_kustomization,
    triggers_by_stream,
)
from tests.support.deploy.compose_file import REPO
from tests.support.deploy.product import cli_command, reads_redis_url_file, router_paths
from tests.support.deploy.schemas import SCHEMAS, kubernetes_schema_path, kubernetes_validator, schema_errors

STOP_AFTER_DRAIN_S = 30.0


@pytest.mark.parametrize("swap", [None, SENTINEL_SWAP], ids=["plain", "sentinel"])
def test_kubectl_kustomize_composes_the_same_objects(swap: dict[str, str] | None, tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl here (its `kustomize` would render deploy/k8s)")
    folder = tmp_path / "k8s"
    shutil.copytree(K8S, folder)
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(swapped_kustomization(swap)))
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
        "ServiceAccount",
        "Deployment",
        "StatefulSet",
        "PodDisruptionBudget",
        "NetworkPolicy",
    }


def test_the_schema_check_refuses_a_broken_object(manifests: list[Object]) -> None:
    broken = copy.deepcopy(one_object(manifests, "Deployment", "switchboard-router"))
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
    container = one_container(manifests, kind, name)
    # The image's entrypoint (tini) stays: `command` would replace it, `args` replace its CMD.
    assert "command" not in container
    args = cli_command(container["args"])
    assert args.command == name.removeprefix("switchboard-")
    settings = container_settings(manifests, kind, name, tmp_path)
    assert deployment_redis_url(manifests, name) == EXAMPLE_SECRET["redis-url"]
    if reads_redis_url_file():
        assert settings.redis.url == EXAMPLE_SECRET["redis-url"]


def test_probes_reach_real_paths_on_the_port_the_router_listens_on(
    manifests: list[Object], tmp_path: Path
) -> None:
    settings = container_settings(manifests, "Deployment", "switchboard-router", tmp_path)
    container = one_container(manifests, "Deployment", "switchboard-router")
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert settings.router.host == "0.0.0.0" and ports["http"] == settings.router.port
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] in router_paths() and ports[get["port"]] == settings.router.port
    service = one_object(manifests, "Service", "switchboard-router")
    assert [port["targetPort"] for port in service["spec"]["ports"]] == ["http"]
    pod_labels = one_object(manifests, "Deployment", "switchboard-router")["spec"]["template"]["metadata"][
        "labels"
    ]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def test_redis_is_persistent_password_protected_and_probed(manifests: list[Object], tmp_path: Path) -> None:
    statefulset = one_object(manifests, "StatefulSet", "switchboard-redis")
    container = one_container(manifests, "StatefulSet", "switchboard-redis")
    config = redis_config(container)
    assert config["appendonly"] == "yes"
    assert config["maxmemory-policy"] == "noeviction"
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert {"name": claim["metadata"]["name"], "mountPath": config["dir"]} in container["volumeMounts"]
    # The password is read from the Secret's file, by Redis and by redis-cli in the probes.
    files = secret_files(statefulset["spec"]["template"]["spec"], container)
    (password_file,) = [path for path, key in files.items() if key == "redis-password"]
    assert config["requirepass"] == f'"$(cat {password_file})"'
    assert "env" not in container
    port = config["port"]
    for probe in ("readinessProbe", "livenessProbe"):
        check = container[probe]["exec"]["command"][-1]
        assert f'REDISCLI_AUTH="$(cat {password_file})" redis-cli -p {port} ping' in check
    service = one_object(manifests, "Service", "switchboard-redis")
    (service_port,) = service["spec"]["ports"]
    # The router and the workers reach Redis where it listens, with its password.
    for name in ("switchboard-router", "switchboard-worker"):
        url = deployment_redis_url(manifests, name)
        assert (
            f":{EXAMPLE_SECRET['redis-password']}@{service['metadata']['name']}:{service_port['port']}/"
            in url
        )
    assert str(service_port["port"]) == port


def test_no_secret_is_on_a_command_line_or_in_an_environment(either_manifests: list[Object]) -> None:
    for container in all_containers(either_manifests):
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
        pods = one_object(manifests, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= pods.items()
    router = one_object(manifests, "Deployment", "switchboard-router")
    assert router["spec"]["replicas"] > budgets["switchboard-router"]["minAvailable"]
    assert budgets["switchboard-worker"]["maxUnavailable"] == 1


def test_workers_drain_within_their_grace_period_on_a_gpu(manifests: list[Object], tmp_path: Path) -> None:
    settings = container_settings(manifests, "Deployment", "switchboard-worker", tmp_path)
    pod = one_object(manifests, "Deployment", "switchboard-worker")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= settings.worker.drain_timeout_s + STOP_AFTER_DRAIN_S
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
    assert "/dev/shm" in mounts


def test_keda_scales_workers_from_zero_on_every_models_job_stream(
    manifests: list[Object], tmp_path: Path
) -> None:
    settings = container_settings(manifests, "Deployment", "switchboard-worker", tmp_path)
    worker = one_object(manifests, "Deployment", "switchboard-worker")
    scaled = one_object(manifests, "ScaledObject", "switchboard-worker")["spec"]
    assert scaled["scaleTargetRef"] == {"name": worker["metadata"]["name"]}
    assert "replicas" not in worker["spec"], "KEDA owns the replica count"
    assert scaled["minReplicaCount"] == 0 and scaled["maxReplicaCount"] >= 1
    assert scaled["fallback"]["replicas"] >= 1  # before any worker made the consumer groups
    assert scaled["cooldownPeriod"] >= max(model.keep_alive_s for model in settings.models)

    by_stream = triggers_by_stream(scaled, settings, "redis-streams")
    assert by_stream == {stream: {"lag", "pending"} for stream in job_streams(settings)}
    redis = address_from_keda(one_object(manifests, "Service", "switchboard-redis"))
    assert {trigger["metadata"]["address"] for trigger in scaled["triggers"]} == {redis}
    assert f"kubectl create namespace {NAMESPACE}" in (REPO / "docs" / "operations.md").read_text()


def test_keda_reads_the_password_redis_is_started_with(manifests: list[Object]) -> None:
    authentication = one_object(manifests, "TriggerAuthentication", "switchboard-redis")["spec"]
    (target,) = authentication["secretTargetRef"]
    assert target["parameter"] == "password"
    pod = one_object(manifests, "StatefulSet", "switchboard-redis")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    files = secret_files(pod, container)
    password_file = password_file_of(container, redis_config(container)["requirepass"])
    assert (target["name"], target["key"]) == ("switchboard-secrets", files[password_file])


def test_images_are_the_ones_deploy_docker_builds(manifests: list[Object]) -> None:
    built = {path.stem for path in (REPO / "deploy" / "docker").glob("*.Dockerfile")}
    for container in all_containers(manifests):
        image, _, tag = container["image"].partition(":")
        if image.startswith("switchboard/"):
            assert image.removeprefix("switchboard/") in built and tag
        else:
            assert re.search(r"\d+\.\d+", tag), f"pin {container['image']}"
