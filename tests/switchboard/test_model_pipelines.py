"""Model pipelines in the configuration: fallbacks over models and routes, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchboard.config import ConfigError, Settings, load_settings

MODELS = """
[[models]]
name = "big"
path = "/m/big"

[[models]]
name = "small"
path = "/m/small"

[[models]]
name = "chat-v2"
path = "/m/v2"

[routes.chat]
targets = {"big" = 90, "chat-v2" = 10}
"""


def settings_with(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "sb.toml"
    path.write_text(MODELS + text)
    return load_settings(path, environ={})


def test_a_pipeline_of_fallbacks_names_models_and_routes_in_order(tmp_path: Path) -> None:
    key = f'\n[[auth.keys]]\nname = "app"\nsha256 = "{"0" * 64}"\nmodels = ["resilient"]\n'
    settings = settings_with(tmp_path, '[pipelines.resilient]\nfallbacks = ["chat", "small"]\n' + key)
    assert settings.pipelines["resilient"].steps() == ["chat", "small"]
    assert settings.auth.keys[0].models == ["resilient"]


@pytest.mark.parametrize(
    ("pipelines", "says"),
    [
        ('[pipelines.big]\nfallbacks = ["small", "chat"]', "may not take the name of a model"),
        ('[pipelines.chat]\nfallbacks = ["small", "big"]', "may not take the name of a route"),
        ('[pipelines.p]\nfallbacks = ["small"]', "at least two steps"),
        ('[pipelines.p]\nfallbacks = ["small", "big", "small"]', "repeated: small"),
        ('[pipelines.p]\nfallbacks = ["small", "huge"]', "unknown models or routes: huge"),
        (
            '[pipelines.p]\nfallbacks = ["small", "q"]\n[pipelines.q]\nfallbacks = ["big", "small"]',
            "not a pipeline: q",
        ),
        ('[pipelines.p]\nfallbacks = ["small", "big"]\nrouter = "x"', "invalid configuration"),
        ('[pipelines."team/p"]\nfallbacks = ["small", "big"]', "invalid configuration"),
    ],
)
def test_a_pipeline_the_config_cannot_use_is_a_config_error(
    tmp_path: Path, pipelines: str, says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        settings_with(tmp_path, pipelines)
