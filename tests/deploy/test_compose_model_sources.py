"""compose.yaml and models in buckets and on the Hub: the workers keep the files in one node cache
volume per machine (no shared volume of models), get a store's credentials only from .env, and
still read a local models folder; the images own the cache's folder; the configuration's examples of
`s3://` and `hf://` models are valid."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from switchboard.config import load_settings
from switchboard.sources.locations import HubLocation, LocalFolder, S3Location, parse_location
from tests.deploy.compose_services import TRTLLM_CONFIG, service_settings
from tests.deploy.store_variables import SECRET_STORE_VARIABLES, store_variables
from tests.support.deploy.compose_file import (
    EXAMPLE_ENV,
    REPO,
    environment,
    load_compose,
    raw_compose,
    volume_mounts,
)

WORKERS = ("worker", "worker-cpu", "worker-trtllm")
WORKER_IMAGES = {
    "worker": "worker-gpu.Dockerfile",
    "worker-cpu": "worker-cpu.Dockerfile",
    "worker-trtllm": "worker-trtllm.Dockerfile",
}
ENV_EXAMPLE = REPO / "deploy" / "compose" / "env.example"


def _compose_for(name: str) -> dict[str, Any]:
    if name == "worker-trtllm":
        return load_compose({**EXAMPLE_ENV, "SWITCHBOARD_CONFIG": TRTLLM_CONFIG})
    return load_compose()


def _named_volumes(compose: dict[str, Any], service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Container path → (named volume, read-only) for the service's named volumes (no bind mounts)."""
    return {
        target: (source, readonly)
        for source, target, readonly in volume_mounts(service)
        if source in compose.get("volumes", {})
    }


@pytest.mark.parametrize("name", WORKERS)
def test_the_node_cache_is_one_writable_volume_at_the_workers_cache_dir(name: str) -> None:
    compose = _compose_for(name)
    settings = service_settings(compose, name)
    named = _named_volumes(compose, compose["services"][name])
    assert environment(compose["services"][name])["SWITCHBOARD_WORKER__MODEL_CACHE_DIR"] == (
        settings.worker.model_cache_dir
    )
    assert named[settings.worker.model_cache_dir] == ("model-files", False)


def test_every_kind_of_worker_shares_the_one_node_cache_and_nothing_else_mounts_it() -> None:
    compose = load_compose()
    holders = {
        name
        for name, service in compose["services"].items()
        if any(source == "model-files" for source, _, _ in volume_mounts(service))
    }
    assert holders == set(WORKERS)  # one volume: `--scale worker=N` downloads once for the machine


@pytest.mark.parametrize("name", WORKERS)
def test_no_worker_mounts_a_shared_volume_of_models(name: str) -> None:
    compose = _compose_for(name)
    service = compose["services"][name]
    # Named volumes are caches only: the node cache and the engines' ~/.cache.
    assert {source for source, _ in _named_volumes(compose, service).values()} == {
        "model-files",
        "model-cache",
    }
    # A local models folder, for those who keep one: a host folder, read-only.
    local = [(source, readonly) for source, target, readonly in volume_mounts(service) if target == "/models"]
    assert local == [("./models", True)]
    moved = load_compose({**EXAMPLE_ENV, "SWITCHBOARD_MODELS_DIR": "/srv/models"})["services"][name]
    assert ("/srv/models", "/models", True) in volume_mounts(moved)


@pytest.mark.parametrize("name", WORKERS)
def test_the_worker_images_own_the_cache_folder_compose_mounts(name: str) -> None:
    cache_dir = service_settings(_compose_for(name), name).worker.model_cache_dir
    dockerfile = (REPO / "deploy" / "docker" / WORKER_IMAGES[name]).read_text()
    # A new named volume takes the image's folder's owner: the worker's user must be able to write.
    made = re.search(r"install -d -o 10001 -g 10001 ([^\n\\]+)", dockerfile)
    assert made is not None and cache_dir in made[1].split()
    (volumes,) = re.findall(r"^VOLUME (\[.*\])$", dockerfile, re.MULTILINE)
    assert f'"{cache_dir}"' in volumes


@pytest.mark.parametrize("name", WORKERS)
def test_a_stores_credentials_come_only_from_the_environment_file(name: str) -> None:
    raw = raw_compose()["services"][name]
    store = {key: value for key, value in raw["environment"].items() if key.startswith(("AWS_", "HF_"))}
    assert set(store) >= SECRET_STORE_VARIABLES and {"AWS_ENDPOINT_URL", "HF_ENDPOINT"} <= set(store)
    assert set(store) <= store_variables(), "only variables botocore or huggingface_hub reads"
    # No value in the file: compose takes each from .env, and leaves an unset one out of the container.
    assert all(value is None for value in store.values()), store
    example = ENV_EXAMPLE.read_text()
    for variable in store.keys() & (SECRET_STORE_VARIABLES | {"AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL"}):
        assert re.search(rf"^# {variable}=", example, re.MULTILINE), f"env.example does not show {variable}"


def test_only_workers_get_a_stores_credentials() -> None:
    compose = load_compose()
    for name, service in compose["services"].items():
        store = {key for key in environment(service) if key.startswith(("AWS_", "HF_"))}
        assert bool(store) == (name in WORKERS), name
        assert "env_file" not in service, f"{name}: an env file would hand it every variable it holds"


def test_no_credential_is_written_into_the_deployment_files() -> None:
    text = (REPO / "compose.yaml").read_text() + ENV_EXAMPLE.read_text()
    for variable in SECRET_STORE_VARIABLES:
        assert not re.search(rf"^\s*#?\s*{variable}[=:][ \t]*\S", text, re.MULTILINE), variable


def _commented_models(config: Path) -> list[str]:
    """The commented-out [[models]] entries of a configuration file, uncommented."""
    blocks, current = [], None
    for line in config.read_text().splitlines():
        if line == "# [[models]]":
            current = [line[2:]]
            blocks.append(current)
        elif current is not None and line.startswith("# ") and not line.startswith("# From"):
            current.append(line[2:])
        else:
            current = None
    return ["\n".join(block) for block in blocks]


def test_the_configurations_examples_of_remote_models_are_valid(tmp_path: Path) -> None:
    config = REPO / "deploy" / "compose" / "switchboard.toml"
    examples = _commented_models(config)
    assert len(examples) >= 3
    uncommented = tmp_path / "switchboard.toml"
    uncommented.write_text("\n\n".join(examples) + "\n")
    settings = load_settings(uncommented, environ={})
    kinds = {type(parse_location(model.path)) for model in settings.models}
    assert kinds == {LocalFolder, S3Location, HubLocation}
    (s3,) = [model for model in settings.models if model.path.startswith("s3://")]
    assert s3.storage is not None and s3.storage.endpoint_url
