"""Which models take images (switchboard/vision_models.py): the entry's word first, else a local
folder's config.json (a vision tower's `vision_config`), else not known before a worker loads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from switchboard.config import ConfigError, ModelConfig, load_settings
from switchboard.vision_models import takes_images


def folder(tmp_path: Path, name: str, config: dict[str, object]) -> str:
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def test_a_local_folder_with_a_vision_tower_takes_images(tmp_path: Path) -> None:
    vlm = folder(
        tmp_path, "vlm", {"architectures": ["Idefics3ForConditionalGeneration"], "vision_config": {}}
    )
    text = folder(tmp_path, "text", {"architectures": ["LlamaForCausalLM"]})
    assert takes_images(ModelConfig(name="vlm", path=vlm)) is True
    assert takes_images(ModelConfig(name="text", path=text)) is False
    assert takes_images(ModelConfig(name="none", path=str(tmp_path / "missing"))) is False


def test_the_entry_decides_over_the_files_and_an_adapter_takes_what_its_base_takes(tmp_path: Path) -> None:
    vlm = folder(tmp_path, "vlm", {"vision_config": {}})
    base = ModelConfig(name="vlm", path=vlm, images=False)
    assert takes_images(base) is False
    adapter = ModelConfig(name="ft", base="vlm", path=str(tmp_path / "ft"))
    assert takes_images(adapter, base) is False
    assert takes_images(adapter, ModelConfig(name="vlm", path=vlm)) is True


def test_a_model_on_tensorrt_llm_takes_none_whatever_its_files_say(tmp_path: Path) -> None:
    vlm = folder(tmp_path, "vlm", {"vision_config": {}})
    assert takes_images(ModelConfig(name="vlm", path=vlm, engine="trtllm")) is False
    assert takes_images(ModelConfig(name="vlm", path=vlm, engine="trtllm", images=True)) is False


def test_a_model_in_a_store_is_not_known_until_declared() -> None:
    assert takes_images(ModelConfig(name="hub", path="hf://org/vlm")) is None
    assert takes_images(ModelConfig(name="hub", path="hf://org/vlm", images=True)) is True


def test_a_pooling_model_or_one_on_tensorrt_llm_cannot_be_told_to_take_images(tmp_path: Path) -> None:
    config = tmp_path / "switchboard.toml"
    config.write_text('[[models]]\nname = "emb"\nkind = "embed"\npath = "/e"\nimages = true\n')
    with pytest.raises(ConfigError, match="images are taken by generators only"):
        load_settings(config, environ={})
    config.write_text('[[models]]\nname = "vlm"\nengine = "trtllm"\npath = "/e"\nimages = true\n')
    with pytest.raises(ConfigError, match="not served on TensorRT-LLM yet"):
        load_settings(config, environ={})
