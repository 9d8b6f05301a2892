"""What the deployment files may name, asked of the product itself: settings, CLI commands, routes."""

from __future__ import annotations

import argparse
import tempfile
import tomllib
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
import pytest

from switchboard.cli.main import ADMIN_KEY_ENV, parse_args
from switchboard.config import Settings, load_settings
from switchboard.config.env import ENV_PREFIX
from switchboard.logs import LOG_LABEL_ENV

# Variables the product reads that are not settings: the Redis URL (or the file that holds it), and
# the CLI's own.
PRODUCT_VARIABLES = {"REDIS_URL", "REDIS_URL_FILE", ADMIN_KEY_ENV, LOG_LABEL_ENV}


@cache
def reads_redis_url_file() -> bool:
    """Whether the product reads the Redis URL from the file REDIS_URL_FILE names."""
    with tempfile.TemporaryDirectory() as folder:
        url_file = Path(folder) / "redis-url"
        url_file.write_text("redis://:probe@example:1/0")
        settings = load_settings(None, environ={"REDIS_URL_FILE": str(url_file)})
        return settings.redis.url == "redis://:probe@example:1/0"


@cache
def router_paths() -> frozenset[str]:
    """Every path the front door routes, from the app the CLI and the container serve."""
    from router.app import create_app

    return frozenset(route.path for route in create_app(Settings()).routes)


def cli_command(argv: list[str]) -> argparse.Namespace:
    """`argv` parsed by `switchboard`'s own parser; the test fails when it is not a real command."""
    assert argv and argv[0] == "switchboard", f"not a switchboard command: {argv}"
    try:
        return parse_args(argv[1:])
    except SystemExit as exc:
        pytest.fail(f"`{' '.join(argv)}` is not a command `switchboard` accepts (exit {exc.code})")


def otel_variables() -> set[str]:
    """The standard OTEL_* variables, as the OpenTelemetry SDK names them."""
    sdk = pytest.importorskip("opentelemetry.sdk.environment_variables")
    api = pytest.importorskip("opentelemetry.environment_variables")
    return {name for module in (sdk, api) for name in dir(module) if name.startswith("OTEL_")}


def settings_from(env: Mapping[str, str], config_path: Path | None) -> Settings:
    """The settings a process started with `env` (and the config file) gets; every variable counts.

    Fails when a variable is neither a setting nor a variable the product reads, when a
    `SWITCHBOARD_*` variable names no field (the loader refuses it) or its value does not arrive
    in the setting it names.
    """
    ours = {name: value for name, value in env.items() if not name.startswith("OTEL_")}
    strangers = sorted(set(ours) - PRODUCT_VARIABLES - {n for n in ours if n.startswith(ENV_PREFIX)})
    assert not strangers, f"variables that are no setting of the product: {strangers}"
    unknown_otel = sorted(set(env) - set(ours) - otel_variables())
    assert not unknown_otel, f"not standard OpenTelemetry variables: {unknown_otel}"
    settings = load_settings(config_path, environ=ours)
    as_data = msgspec.to_builtins(settings)
    for name, value in ours.items():
        if name == "REDIS_URL":
            assert settings.redis.url == value
            continue
        if name == "REDIS_URL_FILE":
            if reads_redis_url_file() and "REDIS_URL" not in ours:
                assert settings.redis.url == Path(value).read_text().strip()
            continue
        if name in PRODUCT_VARIABLES:
            continue
        assert "__" in name, f"{name} has no `__`: the loader ignores it (SWITCHBOARD_<SECTION>__<FIELD>)"
        section, _, field = name[len(ENV_PREFIX) :].lower().partition("__")
        assert field in as_data.get(section, {}), f"{name}: `{section}.{field}` is no setting"
        assert as_data[section][field] == _literal(value), f"{name}={value!r} did not reach {section}.{field}"
    return settings


def _literal(value: str) -> Any:
    """How the loader reads a variable's value: a TOML literal where it is one, a string otherwise."""
    try:
        return tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return value
