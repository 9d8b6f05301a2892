"""Settings from the TOML file and the environment, validated: `load_settings`.

Environment variables override single fields: ``SWITCHBOARD_<SECTION>__<FIELD>`` (for example
``SWITCHBOARD_ROUTER__PORT=8001``), ``REDIS_URL`` sets ``redis.url`` and ``REDIS_URL_FILE`` sets
``redis.url_file`` (`switchboard.config.env`). Values are read as TOML literals where they parse as
one (numbers, booleans, arrays) and as plain strings otherwise. Everything is validated here, so a
typo fails loudly before anything serves.

Loading changes nothing outside the settings it returns: whoever starts a process puts that
process's Redis keys under `redis.key_prefix` (`keys.set_prefix`, in `switchboard.cli.main`).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from switchboard.config.adapters import with_lora_defaults
from switchboard.config.checks import ConfigError, check_settings
from switchboard.config.env import EnvironmentOverrideError, apply_environment
from switchboard.config.models import demo_model
from switchboard.config.pipeline_checks import router_models
from switchboard.config.settings import Settings
from switchboard.redis_address import RedisAddressError, checked_redis_url


def load_settings(path: Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Read the TOML file (if any), apply environment overrides and validate the result."""
    environ = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    try:
        apply_environment(raw, environ)
    except EnvironmentOverrideError as exc:
        raise ConfigError(str(exc)) from None
    try:
        settings = msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from exc
    try:
        settings.redis.url = checked_redis_url(settings.redis.url, settings.redis.url_file)
    except RedisAddressError as exc:
        raise ConfigError(str(exc)) from None
    if not settings.models:
        settings.models = [demo_model(settings.worker.demo_model_dir)]
    check_settings(settings)
    settings.models = with_lora_defaults(settings.models)
    routers = router_models(settings.routes, settings.pipelines)
    for model in settings.models:
        model.warm_structured_output = model.warm_structured_output or model.name in routers
    return settings
