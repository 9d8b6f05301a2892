"""Which models take images: what their entry says, else what their files say.

A vision-language model's `config.json` has a `vision_config` (the vision tower's own settings:
Idefics3, LLaVA, Qwen2-VL, Gemma 3, Mllama...); a text model's has none. The front door reads it for
a model in a local folder, so that an image sent to a text model is refused before anything is
queued; a model in a store is known once a worker has loaded it (its published limits say whether
it takes images), and until then the worker refuses what it cannot take, still before the first byte.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from switchboard.config import ModelConfig
from switchboard.sources.locations import LocalFolder, parse_location

# The engines whose workers run images (TensorRT-LLM's refuses them: its multimodal path is not written).
IMAGE_ENGINES = ("vllm",)


def takes_images(model: ModelConfig, base: ModelConfig | None = None) -> bool | None:
    """Whether `model` takes images (an adapter: whether its `base` does); None where neither its
    entry nor local files say (a model in a store). A model on an engine that runs no images takes none."""
    decides = base if model.base is not None and base is not None else model
    if decides.engine_name not in IMAGE_ENGINES:
        return False
    if decides.images is not None:
        return decides.images
    try:
        location = parse_location(decides.path)
    except ValueError:
        return None
    if not isinstance(location, LocalFolder):
        return None
    return folder_takes_images(str(Path(decides.path).expanduser()))


@functools.lru_cache(maxsize=1024)
def folder_takes_images(folder: str) -> bool:
    """Whether the model in `folder` has a vision tower (read once per folder: a model's files do
    not change under a running router). A folder without a readable config.json takes none."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)
