"""compose.yaml's services as their processes see them: the settings a `switchboard` service reads
(its config file, its environment, its secret files), the Redis URL it reads, and the configuration
a Redis or Sentinel start script writes in a here-document."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from switchboard.config import Settings
from tests.deploy.store_variables import store_variables
from tests.support.deploy.compose_file import EXAMPLE_ENV, REPO, environment, secret_files, secret_value
from tests.support.deploy.product import cli_command, settings_from

SWITCHBOARD_SERVICES = ("router", "worker", "worker-cpu", "worker-trtllm")
TRTLLM_CONFIG = "./deploy/compose/switchboard-trtllm.toml"


def config_source(compose: dict[str, Any], service: dict[str, Any], container_path: str) -> Path:
    """The host file compose mounts at `container_path` in the service (one of its `configs`)."""
    for config in service.get("configs", []):
        if config["target"] == container_path:
            return REPO / compose["configs"][config["source"]]["file"]
    pytest.fail(f"nothing is mounted at {container_path}")


def service_settings(compose: dict[str, Any], name: str, env: Mapping[str, str] = EXAMPLE_ENV) -> Settings:
    """What the service's `switchboard` process runs with: its config file, its environment and the
    secrets mounted for it (written where its variables name them, as the container has them). A
    bucket's or the Hub's variables are no setting: each must be one botocore or huggingface_hub reads."""
    service = compose["services"][name]
    args = cli_command(service["command"])
    assert args.config is not None, f"{name} runs without --config"
    with tempfile.TemporaryDirectory() as folder:
        variables = environment(service)
        for target, secret in secret_files(compose, service).items():
            local = Path(folder) / Path(target).name
            local.write_text(secret_value(compose, secret, env))
            variables = {key: str(local) if value == target else value for key, value in variables.items()}
        strangers = {name for name in variables if name.startswith(("AWS_", "HF_"))} - store_variables()
        assert not strangers, f"{name}: variables neither botocore nor huggingface_hub reads: {strangers}"
        variables = {key: value for key, value in variables.items() if key not in store_variables()}
        return settings_from(variables, config_source(compose, service, str(args.config)))


def service_redis_url(compose: dict[str, Any], name: str, env: Mapping[str, str] = EXAMPLE_ENV) -> str:
    """The Redis URL the service's process reads: the secret mounted where REDIS_URL_FILE points."""
    service = compose["services"][name]
    mounted = secret_files(compose, service)
    return secret_value(compose, mounted[environment(service)["REDIS_URL_FILE"]], env)


def config_lines(service: dict[str, Any], opener: str) -> list[str]:
    """The configuration a service's start script writes in the here-document that follows `opener`."""
    assert service["command"][:2] == ["sh", "-c"]
    body = re.search(rf"{re.escape(opener)} <<EOF\n(.*?)\nEOF", service["command"][2], re.DOTALL)
    assert body is not None, f"no here-document after `{opener}`"
    return [line.strip() for line in body[1].splitlines() if line.strip()]


def redis_config(redis: dict[str, Any]) -> dict[str, str]:
    """Redis's configuration as its command hands it over: on standard input, a here-document."""
    return dict(line.partition(" ")[::2] for line in config_lines(redis, "exec redis-server -"))
