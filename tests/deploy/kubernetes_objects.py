"""deploy/k8s as `kubectl apply -k` applies it (plain Redis, or Redis under Sentinel swapped in as
kustomization.yaml's comment says), and what a container of it runs with: its start script, its
variables, the Secret's files, the settings its `switchboard` process reads."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from switchboard import keys
from switchboard.config import Settings
from tests.support.deploy.compose_file import REPO
from tests.support.deploy.product import cli_command, settings_from

K8S = REPO / "deploy" / "k8s"
KEDA_KINDS = {"ScaledObject", "TriggerAuthentication"}
# What the Secret `switchboard-secrets` holds, as docs/operations.md's Kubernetes section creates it.
EXAMPLE_SECRET = {
    "redis-password": "examplepassword",
    "redis-url": "redis://:examplepassword@switchboard-redis:6379/0",
    "admin-key-sha256": "0" * 64,
}
# The namespace docs/operations.md creates and applies into; KEDA's operator, in a namespace of its own,
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


def swapped_kustomization(swap: Mapping[str, str] | None = None) -> Object:
    """kustomization.yaml, with the resources `swap` names replaced as its comment says."""
    kustomization: Object = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    swap = swap or {}
    assert set(swap) <= set(kustomization["resources"])
    kustomization["resources"] = [swap.get(resource, resource) for resource in kustomization["resources"]]
    return kustomization


def compose_kustomization(swap: Mapping[str, str] | None = None) -> list[Object]:
    """The objects `kubectl apply -k deploy/k8s` applies: resources, with labels and image tags."""
    kustomization = swapped_kustomization(swap)
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
    for container in all_containers(objects):
        if container["image"] in tags:
            container["image"] = f"{container['image']}:{tags[container['image']]}"
    return objects


def all_containers(objects: list[Object]) -> Iterator[Object]:
    for document in objects:
        if document["kind"] in ("Deployment", "StatefulSet"):
            yield from document["spec"]["template"]["spec"]["containers"]


def one_object(objects: list[Object], kind: str, name: str) -> Object:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def one_container(objects: list[Object], kind: str, name: str) -> Object:
    (container,) = one_object(objects, kind, name)["spec"]["template"]["spec"]["containers"]
    return container


def container_environment(container: Object) -> dict[str, str]:
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


def secret_files(pod: Object, container: Object) -> dict[str, str]:
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


def container_settings(
    objects: list[Object], kind: str, name: str, tmp_path: Path, secret: Mapping[str, str] = EXAMPLE_SECRET
) -> Settings:
    """What the container's `switchboard` process runs with: the ConfigMap's file, its variables and
    the Secret's files (written where its variables name them)."""
    pod = one_object(objects, kind, name)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = cli_command(container["args"])
    assert args.config is not None
    mount = Path(args.config).parent
    (volume_name,) = [m["name"] for m in container["volumeMounts"] if Path(m["mountPath"]) == mount]
    (volume,) = [v for v in pod["volumes"] if v["name"] == volume_name]
    config_map = one_object(objects, "ConfigMap", volume["configMap"]["name"])
    config_path = tmp_path / f"{name}.toml"
    config_path.write_text(config_map["data"][Path(args.config).name])
    variables = container_environment(container)
    for path, key in secret_files(pod, container).items():
        local = tmp_path / f"{name}-{key}"
        local.write_text(secret[key])
        variables = {
            variable: str(local) if value == path else value for variable, value in variables.items()
        }
    return settings_from(variables, config_path)


def deployment_redis_url(objects: list[Object], name: str) -> str:
    """The Redis URL the Deployment's process reads: the Secret's file REDIS_URL_FILE names."""
    pod = one_object(objects, "Deployment", name)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return EXAMPLE_SECRET[secret_files(pod, container)[container_environment(container)["REDIS_URL_FILE"]]]


def start_script(container: Object) -> str:
    """The shell script a container starts with, as the shell gets it."""
    assert container["args"][:2] == ["sh", "-c"]
    return str(container["args"][2]).replace("$$", "$")  # Kubernetes' escape of `$`


def config_lines(container: Object, opener: str) -> list[str]:
    """The configuration a start script writes in the here-document that follows `opener`."""
    body = re.search(rf"{re.escape(opener)} <<EOF\n(.*?)\nEOF", start_script(container), re.DOTALL)
    assert body is not None, f"no here-document after `{opener}`"
    return [line.strip() for line in body[1].splitlines() if line.strip()]


def redis_config(container: Object) -> dict[str, str]:
    """Redis's configuration as its command hands it over: on standard input, a here-document."""
    lines = config_lines(container, "exec redis-server -")
    return dict(line.partition(" ")[::2] for line in lines)


def job_streams(settings: Settings) -> set[str]:
    """Each model's job stream, under the deployment's key prefix."""
    previous = keys.PREFIX
    keys.set_prefix(settings.redis.key_prefix)
    try:
        return {keys.job_stream(model.name) for model in settings.models}
    finally:
        keys.set_prefix(previous)


def triggers_by_stream(scaled: Object, settings: Settings, trigger_type: str) -> dict[str, set[str]]:
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


def address_from_keda(service: Object) -> str:
    """Where KEDA's operator, in its own namespace, reaches a Service of ours: by a name that
    includes our namespace (a Service's short name resolves only inside its namespace)."""
    (port,) = service["spec"]["ports"]
    return f"{service['metadata']['name']}.{NAMESPACE}.svc:{port['port']}"


def password_file_of(container: Object, config_line: str) -> str:
    """The file a `... "$(cat FILE)"` line of a start command reads its password from."""
    found = re.search(r"\$\(cat (\S+)\)", config_line)
    assert found is not None, config_line
    return found[1]
