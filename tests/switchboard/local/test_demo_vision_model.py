"""The tiny vision-language model (switchboard/local/demo_vision_model.py), built offline: its
processor renders an image part of a chat into the model's image tokens without torchvision, and a
second build finds the first."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from switchboard.local.demo_vision_model import IMAGE_SEQ_LEN, build_demo_vision_model


def test_the_model_takes_an_image_through_its_own_processor(tmp_path: Path) -> None:
    from transformers import AutoProcessor

    folder = build_demo_vision_model(tmp_path / "vlm")
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Idefics3ForConditionalGeneration"]
    processor = AutoProcessor.from_pretrained(folder)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    assert prompt.endswith("<|assistant|>\n") and "<image>" in prompt
    image = Image.fromarray(np.full((64, 80, 3), (200, 30, 30), dtype=np.uint8))
    inputs = processor(text=prompt, images=[image], return_tensors="np")
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert int((inputs["input_ids"] == image_id).sum()) == IMAGE_SEQ_LEN
    assert inputs["pixel_values"].shape[-2:] == (56, 56)
    modified = (folder / "model.safetensors").stat().st_mtime_ns
    assert build_demo_vision_model(folder) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == modified
