"""LoRA adapters in `[[models]]`: an adapter names a generator (vLLM or TensorRT-LLM) as its base and sets nothing of its
engine; a base named by adapters gets LoRA settings that take their ranks; a worker that may hold a
base may hold its adapters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from switchboard.config import ConfigError, Settings, load_settings

BASE = '[[models]]\nname = "base"\npath = "/models/base"\n'


def _load(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "switchboard.toml"
    path.write_text(text)
    return load_settings(path, environ={})


def _adapter_folder(tmp_path: Path, rank: int) -> Path:
    folder = tmp_path / f"rank-{rank}"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank}))
    return folder


def test_a_base_named_by_adapters_takes_their_largest_rank_rounded_to_the_engines(tmp_path: Path) -> None:
    small, large = _adapter_folder(tmp_path, 8), _adapter_folder(tmp_path, 48)
    text = BASE + "".join(
        f'[[models]]\nname = "ft-{n}"\nbase = "base"\npath = "{folder}"\n'
        for n, folder in enumerate([small, large])
    )
    settings = _load(tmp_path, text)
    base, *adapters = settings.models
    assert base.lora is not None and base.lora.max_rank == 64
    assert [(a.base, a.adapter, a.lora) for a in adapters] == [("base", True, None)] * 2


def test_a_base_keeps_the_lora_table_it_sets(tmp_path: Path) -> None:
    text = BASE + "lora = { max_rank = 32, max_adapters = 500 }\n"
    text += '[[models]]\nname = "ft"\nbase = "base"\npath = "s3://bucket/ft"\n'
    base = _load(tmp_path, text).models[0]
    assert base.lora is not None and (base.lora.max_rank, base.lora.max_adapters) == (32, 500)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[[models]]\nname = "ft"\nbase = "nope"\npath = "/a"\n', "base 'nope' is not a configured model"),
        ('[[models]]\nname = "ft"\nbase = "base"\npath = "/a"\nengine_args = { dtype = "half" }\n', "remove engine_args"),
        ('[[models]]\nname = "ft"\nbase = "base"\npath = "/a"\nimages = true\n', "remove images"),
        ('[[models]]\nname = "ft"\nbase = "base"\npath = "/a"\n[[models]]\nname = "ft2"\nbase = "ft"\npath = "/b"\n',
         "is itself an adapter"),
        ('[[models]]\nname = "emb"\nkind = "embed"\npath = "/e"\n[[models]]\nname = "ft"\nbase = "emb"\npath = "/a"\n',
         "served on generators of vLLM or TensorRT-LLM"),
    ],
)  # fmt: skip
def test_an_adapter_that_does_not_fit_its_base_fails_at_start(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ConfigError, match="ft") as caught:
        _load(tmp_path, BASE + text)
    assert says in str(caught.value)


def test_a_worker_that_may_hold_a_base_may_hold_its_adapters(tmp_path: Path) -> None:
    text = (
        BASE
        + '[[models]]\nname = "ft"\nbase = "base"\npath = "/a"\n[[models]]\nname = "other"\npath = "/o"\n'
    )
    text += '[worker]\nmodels = ["base"]\n'
    assert [m.name for m in _load(tmp_path, text).worker_models()] == ["base", "ft"]
