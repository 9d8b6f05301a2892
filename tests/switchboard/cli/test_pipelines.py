"""`switchboard pipelines` and `switchboard models` without a front door: how a pipeline's file is
read, and how each shape is shown."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from switchboard.cli.models import render_names
from switchboard.cli.pipelines import read_definition


def test_each_shape_is_shown_with_its_steps_under_the_models_table() -> None:
    cards = [
        {
            "id": "resilient",
            "owned_by": "switchboard-pipeline",
            "shape": "fallbacks",
            "steps": ["big", "small"],
        },
        {
            "id": "picker",
            "owned_by": "switchboard-pipeline",
            "shape": "router",
            "steps": ["tiny", "coder", "big"],
        },
        {"id": "cheap", "owned_by": "switchboard-pipeline", "shape": "cascade", "steps": ["small", "big"]},
    ]
    assert render_names(cards).splitlines() == [
        "pipeline resilient: fallbacks big -> small",
        "pipeline picker: router tiny chooses: coder | big",
        "pipeline cheap: cascade small, else big",
    ]


def test_a_pipeline_file_is_json_or_toml_its_fields_alone_or_in_a_config_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "p.conf"
    path.write_text('fallbacks = ["big", "small"]\n')
    assert read_definition(path, "p") == {"fallbacks": ["big", "small"]}
    path.write_text('[pipelines.p.cascade]\ndraft = "small"\nstrong = "big"\n')
    assert read_definition(path, "p") == {"cascade": {"draft": "small", "strong": "big"}}
    with pytest.raises(ValueError, match="none named 'q'"):
        read_definition(path, "q")
    monkeypatch.setattr("sys.stdin", io.StringIO('{"fallbacks": ["a", "b"]}'))
    assert read_definition(Path("-"), "p") == {"fallbacks": ["a", "b"]}
    for text, message in (("[1, 2]", "a table"), ("fallbacks = [", "neither JSON nor TOML")):
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            read_definition(path, "p")
