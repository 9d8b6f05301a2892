"""Environment overrides of the settings: `SWITCHBOARD_<SECTION>__<FIELD>`, `REDIS_URL` and
`REDIS_URL_FILE` (applied by `switchboard.config.loader` over the TOML file)."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from typing import Any

ENV_PREFIX = "SWITCHBOARD_"


class EnvironmentOverrideError(ValueError):
    """An override names something that cannot be overridden; the message says which."""


def apply_environment(raw: dict[str, Any], environ: Mapping[str, str]) -> None:
    """Apply the environment's overrides to the settings read from the file (`raw`), in place."""
    redis_table = raw.get("redis")
    if environ.get("REDIS_URL"):
        raw.setdefault("redis", {})["url"] = environ["REDIS_URL"]
    elif environ.get("REDIS_URL_FILE"):
        # The environment's file wins over the config file's URL, as REDIS_URL would.
        if isinstance(redis_table, dict):
            redis_table.pop("url", None)
        raw.setdefault("redis", {})["url_file"] = environ["REDIS_URL_FILE"]
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, field = name[len(ENV_PREFIX) :].lower().partition("__")
        table = raw.setdefault(section, {})
        if not isinstance(table, dict):
            raise EnvironmentOverrideError(
                f"{name} overrides a field of `{section}`, which is not a table of settings"
            )
        table[field] = _parse_literal(value)


def _parse_literal(value: str) -> Any:
    """`8001` → 8001, `[\"a\"]` → [\"a\"], `true` → True; anything else stays a string."""
    try:
        return tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return value
