"""deploy/k8s and models in buckets and on the Hub: no shared volume of models, a node cache volume
at the worker's cache dir sized above its budget (an emptyDir, or the documented hostPath that
outlives pods), a store's credentials only from a Secret or the pod's role, and a configuration whose
models are `s3://` and `hf://` ones."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import yaml

from switchboard.sources.locations import HubLocation, S3Location, parse_location
from tests.deploy.kubernetes_objects import K8S, Object, container_settings, one_container, one_object
from tests.deploy.store_variables import SECRET_STORE_VARIABLES, store_variables
from tests.support.deploy.schemas import kubernetes_validator, schema_errors

STORE_SECRET = "switchboard-store-credentials"
UNITS = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4}


def _worker_pod(manifests: list[Object]) -> Object:
    pod: Object = one_object(manifests, "Deployment", "switchboard-worker")["spec"]["template"]["spec"]
    return pod


def _bytes(quantity: str) -> int:
    found = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)", quantity)
    assert found is not None, quantity
    return int(found[1]) * UNITS[found[2]]


def test_no_pod_mounts_a_shared_volume_of_models(manifests: list[Object]) -> None:
    for document in manifests:
        if document["kind"] == "Deployment":
            volumes = document["spec"]["template"]["spec"].get("volumes", [])
            assert not [v for v in volumes if "persistentVolumeClaim" in v], document["metadata"]["name"]
    mounts = [
        m["mountPath"] for m in one_container(manifests, "Deployment", "switchboard-worker")["volumeMounts"]
    ]
    assert "/models" not in mounts


def test_the_node_cache_is_a_volume_at_the_workers_cache_dir_above_its_budget(
    manifests: list[Object], tmp_path: Path
) -> None:
    settings = container_settings(manifests, "Deployment", "switchboard-worker", tmp_path)
    container = one_container(manifests, "Deployment", "switchboard-worker")
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == settings.worker.model_cache_dir]
    assert not mount.get("readOnly")
    (volume,) = [v for v in _worker_pod(manifests)["volumes"] if v["name"] == mount["name"]]
    limit = _bytes(volume["emptyDir"]["sizeLimit"])
    # The worker evicts within its budget; the kubelet evicts the pod past the volume's limit.
    assert settings.worker.model_cache_gib is not None
    assert settings.worker.model_cache_gib * 1024**3 < limit


def _commented_block(text: str, opener: str) -> str:
    """The commented YAML that starts at the line `opener` (uncommented), up to the first line that
    is no longer a comment at the same depth."""
    lines = text.splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.strip() == f"# {opener}"]
    indent = lines[start].index("#")
    block = []
    for line in lines[start:]:
        if not line.startswith(" " * indent + "# ") or line[indent + 2] == "(":
            break
        block.append(line[indent + 2 :])
    return "\n".join(block)


def test_the_documented_host_path_cache_replaces_the_empty_dir_and_validates(manifests: list[Object]) -> None:
    block = _commented_block((K8S / "worker.yaml").read_text(), "- name: model-files")
    (host_volume,) = yaml.safe_load(block)
    assert host_volume["hostPath"]["type"] == "Directory"  # made for the worker's user, not by the kubelet
    deployment = copy.deepcopy(one_object(manifests, "Deployment", "switchboard-worker"))
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    (index,) = [i for i, volume in enumerate(volumes) if volume["name"] == host_volume["name"]]
    volumes[index] = host_volume
    assert schema_errors(kubernetes_validator("apps/v1", "Deployment"), deployment) == []


def test_a_stores_credentials_come_only_from_a_secret_or_the_pods_role(manifests: list[Object]) -> None:
    pod = _worker_pod(manifests)
    container = one_container(manifests, "Deployment", "switchboard-worker")
    assert container["envFrom"] == [{"secretRef": {"name": STORE_SECRET, "optional": True}}]
    assert not [v["name"] for v in container.get("env", []) if v["name"].startswith(("AWS_", "HF_"))]
    for document in manifests:
        if document["kind"] == "Deployment" and document["metadata"]["name"] != "switchboard-worker":
            for other in document["spec"]["template"]["spec"]["containers"]:
                assert "envFrom" not in other
    # A role instead of a key: the workers' own service account, which mounts no API token.
    account = one_object(manifests, "ServiceAccount", pod["serviceAccountName"])
    assert account["automountServiceAccountToken"] is False and pod["automountServiceAccountToken"] is False
    assert "eks.amazonaws.com/role-arn" in (K8S / "worker.yaml").read_text()


def test_the_store_secret_example_is_valid_and_not_applied() -> None:
    secret = yaml.safe_load((K8S / "store-credentials.example.yaml").read_text())
    assert schema_errors(kubernetes_validator("v1", "Secret"), secret) == []
    assert secret["metadata"]["name"] == STORE_SECRET
    assert set(secret["stringData"]) <= store_variables()
    assert {key: secret["stringData"][key] for key in SECRET_STORE_VARIABLES & set(secret["stringData"])} == {
        key: "REPLACE-ME" for key in SECRET_STORE_VARIABLES & set(secret["stringData"])
    }
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert "store-credentials.example.yaml" not in kustomization["resources"]


def test_the_example_configuration_reads_models_from_a_bucket_and_the_hub(
    manifests: list[Object], tmp_path: Path
) -> None:
    settings = container_settings(manifests, "Deployment", "switchboard-worker", tmp_path)
    kinds = {type(parse_location(model.path)) for model in settings.models}
    assert kinds == {S3Location, HubLocation}
