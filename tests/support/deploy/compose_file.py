"""compose.yaml as `docker compose` reads it: YAML (merge keys included), then variable interpolation.

Interpolation follows the Compose specification: `$$` is a literal `$`; `${VAR}` and `$VAR`;
`${VAR:-default}` / `${VAR-default}` (default when unset or empty / unset); `${VAR:?error}` /
`${VAR?error}` (an error when unset or empty / unset); `${VAR:+other}` / `${VAR+other}`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
COMPOSE_PATH = REPO / "compose.yaml"

# What a filled-in .env (deploy/compose/env.example) gives: passwords, the Redis URL, an admin key's hash.
EXAMPLE_ENV = {
    "COMPOSE_PROFILES": "gpu",
    "REDIS_PASSWORD": "examplepassword",
    "REDIS_URL": "redis://:examplepassword@redis:6379/0",
    "GRAFANA_ADMIN_PASSWORD": "examplegrafanapassword",
    "SWITCHBOARD_ADMIN_KEY_SHA256": "0" * 64,
}

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))"
)


class InterpolationError(ValueError):
    """A `${VAR?error}` whose variable is missing: compose refuses the file with this message."""


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """`text` with every variable replaced as compose would replace it from `env`."""

    def replace(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["braced"] or match["plain"]
        value = env.get(name)
        op, arg = match["op"], match["arg"] or ""
        if op is None:
            return value or ""
        empty_counts = op.startswith(":")
        missing = value is None or (empty_counts and value == "")
        kind = op[-1]
        if kind == "-":
            return interpolate(arg, env) if missing else str(value)
        if kind == "?":
            if missing:
                raise InterpolationError(f"required variable {name} is missing a value: {arg}")
            return str(value)
        return "" if missing else interpolate(arg, env)  # "+"

    return _VARIABLE.sub(replace, text)


def _interpolated(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_interpolated(item, env) for item in node]
    if isinstance(node, dict):
        return {key: _interpolated(value, env) for key, value in node.items()}
    return node


def raw_compose(path: Path = COMPOSE_PATH) -> dict[str, Any]:
    """The compose file as YAML, merge keys resolved, variables left as written."""
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict)
    return document


def load_compose(env: Mapping[str, str] | None = None, path: Path = COMPOSE_PATH) -> dict[str, Any]:
    """The compose file with variables interpolated from `env` (a filled-in .env by default)."""
    return dict(_interpolated(raw_compose(path), EXAMPLE_ENV if env is None else env))


def active_services(compose: Mapping[str, Any], profiles: set[str]) -> dict[str, dict[str, Any]]:
    """The services `docker compose up` starts with these profiles on."""
    return {
        name: service
        for name, service in compose["services"].items()
        if not service.get("profiles") or profiles & set(service["profiles"])
    }


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's `environment`, in either of compose's forms, as strings."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = (item.partition("=") for item in env)
        return {name: value for name, _, value in pairs}
    return {name: "" if value is None else _scalar(value) for name, value in env.items()}


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def duration_s(text: str) -> float:
    """A compose duration (`1m30s`, `90s`, `2m`, `500ms`) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a compose duration: {text!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


def volume_mounts(service: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, container path, read-only) for each of a service's volumes, short or long form."""
    mounts = []
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, _, rest = volume.partition(":")
            target, _, mode = rest.partition(":")
            mounts.append((source, target, "ro" in mode.split(",")))
        else:
            mounts.append((volume.get("source", ""), volume["target"], bool(volume.get("read_only"))))
    return mounts


def secret_files(compose: Mapping[str, Any], service: Mapping[str, Any]) -> dict[str, str]:
    """Container path → name of the compose secret mounted there, for each of a service's secrets."""
    files = {}
    for secret in service.get("secrets", []):
        source = secret if isinstance(secret, str) else secret["source"]
        target = source if isinstance(secret, str) else secret.get("target", source)
        assert source in compose.get("secrets", {}), f"no top-level secret {source}"
        files[target if target.startswith("/") else f"/run/secrets/{target}"] = source
    return files


def secret_value(compose: Mapping[str, Any], name: str, env: Mapping[str, str]) -> str:
    """What compose puts in the secret `name`, given .env's variables `env`."""
    secret = compose["secrets"][name]
    if "environment" in secret:
        return env[secret["environment"]]
    return (REPO / secret["file"]).read_text()
