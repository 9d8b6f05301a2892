"""A base's LoRA settings where its entry has none: derived from the adapters configured on it.

An adapter's rank is read from its `adapter_config.json` where the adapter is a local folder; the
base takes the largest rank among them, rounded up to a rank the engine compiles (an adapter in a
store is checked against the base's rank when it loads).
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from switchboard.config.models import LoraConfig, ModelConfig
from switchboard.sources.locations import LocalFolder, parse_location

# The ranks vLLM's LoRA kernels are built for.
ENGINE_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def with_lora_defaults(models: list[ModelConfig]) -> list[ModelConfig]:
    """`models`, each base that an adapter names and that has no `lora` table given one."""
    adapters: dict[str, list[ModelConfig]] = {}
    for model in models:
        if model.base is not None:
            adapters.setdefault(model.base, []).append(model)
    return [
        msgspec.structs.replace(model, lora=derived_lora(adapters[model.name]))
        if model.lora is None and model.name in adapters
        else model
        for model in models
    ]


def derived_lora(adapters: list[ModelConfig]) -> LoraConfig:
    """The default settings, with a rank that takes every local adapter of the list."""
    ranks = [rank for adapter in adapters if (rank := local_rank(adapter.path)) is not None]
    default = LoraConfig()
    return LoraConfig(max_rank=engine_rank(max([default.max_rank, *ranks])))


def local_rank(path: str) -> int | None:
    """The rank a local adapter folder declares; None for a remote one or a folder without it."""
    try:
        location = parse_location(path)
    except ValueError:
        return None
    if not isinstance(location, LocalFolder):
        return None
    try:
        config = json.loads((Path(path).expanduser() / "adapter_config.json").read_text())
        return int(config["r"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def engine_rank(rank: int) -> int:
    """The smallest rank the engine compiles that takes `rank` (the largest if none does)."""
    return next((allowed for allowed in ENGINE_RANKS if allowed >= rank), ENGINE_RANKS[-1])
