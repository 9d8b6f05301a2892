"""Settings written as TOML read back the same, and as valid Switchboard settings."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from switchboard.config import DEMO_MODEL_NAME, load_settings
from switchboard.local.demo_model import config_entry
from switchboard.local.toml_text import toml_text


def test_round_trip_through_tomllib() -> None:
    settings = {
        "title": 'quotes " and \\ backslashes\nand a newline, é ✓',
        "router": {"host": "127.0.0.1", "port": 8000, "request_timeout_s": 0.5, "flag": True},
        "worker": {"models": ["a", "b/c"], "memory_budget_gib": None},
        "models": [
            {"name": "a", "path": "/m", "engine_args": {"dtype": "float32", "max_model_len": 64}},
            {"name": "b/c", "path": "/m", "engine_args": {}, "odd key": 1.0e-3},
        ],
    }
    read = tomllib.loads(toml_text(settings))
    del settings["worker"]["memory_budget_gib"]  # type: ignore[attr-defined]
    assert read == settings


def test_paths_are_written_as_strings() -> None:
    assert tomllib.loads(toml_text({"worker": {"demo_model_dir": Path("/x/y")}})) == {
        "worker": {"demo_model_dir": "/x/y"}
    }


def test_values_toml_cannot_hold_are_refused() -> None:
    with pytest.raises(TypeError):
        toml_text({"router": {"port": object()}})


def test_demo_model_entry_is_a_valid_preloaded_model(tmp_path: Path) -> None:
    config = tmp_path / "switchboard.toml"
    entry = config_entry(tmp_path / "model", preload=True, keep_alive_s=5)
    config.write_text(toml_text({"router": {"port": 8123}, "models": [entry]}))
    settings = load_settings(config, environ={})
    (model,) = settings.models
    assert (model.name, model.path, model.preload, model.keep_alive_s) == (
        DEMO_MODEL_NAME,
        str(tmp_path / "model"),
        True,
        5,
    )
    assert model.engine_args == {"max_model_len": 1024, "dtype": "float32", "enforce_eager": True}
    assert settings.router.port == 8123
