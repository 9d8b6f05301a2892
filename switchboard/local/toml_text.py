"""Settings written as TOML, for the configuration files the local tools hand to the processes they start.

Python reads TOML (tomllib) but does not write it. Settings are a shallow tree: top-level tables of
values (`[router]`), arrays of tables (`[[models]]`), and inline tables inside them (`engine_args`),
which is all this writes. None means "not set": the key is left out, as TOML has no null.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_text(settings: Mapping[str, Any]) -> str:
    """A TOML document that `tomllib.loads` reads back as `settings` (None values dropped)."""
    lines: list[str] = []
    tables: list[tuple[str, Mapping[str, Any]]] = []
    arrays: list[tuple[str, list[Mapping[str, Any]]]] = []
    for key, value in settings.items():
        if value is None:
            continue
        if isinstance(value, Mapping):
            tables.append((key, value))
        elif isinstance(value, list) and value and all(isinstance(item, Mapping) for item in value):
            arrays.append((key, value))
        else:
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, table in tables:
        lines += ["", f"[{_key(key)}]", *_pairs(table)]
    for key, items in arrays:
        for item in items:
            lines += ["", f"[[{_key(key)}]]", *_pairs(item)]
    return "\n".join(lines).lstrip("\n") + "\n"


def _pairs(table: Mapping[str, Any]) -> list[str]:
    return [f"{_key(key)} = {_value(value)}" for key, value in table.items() if value is not None]


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _value(value: Any) -> str:
    # bool before int: True is an int too.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        # JSON's string escapes are all valid in a TOML basic string.
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(item) for item in value if item is not None) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(_pairs(value)) + " }" if value else "{}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML: {value!r}")
