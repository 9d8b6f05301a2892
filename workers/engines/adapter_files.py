"""What a LoRA adapter's folder must hold before an engine is asked to load it, checked in words an
operator can act on (the engine's own errors name neither the adapter nor the setting to change)."""

from __future__ import annotations

import json
from pathlib import Path

from workers.engines.base import Adapter, AdapterRefused

WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


def check_adapter_folder(adapter: Adapter, *, max_rank: int) -> None:
    """AdapterRefused unless the folder holds a PEFT LoRA config and weights of a rank the base takes."""
    folder = Path(adapter.path)
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
    except OSError:
        raise AdapterRefused(f"adapter {adapter.name}: no adapter_config.json in {folder}") from None
    except ValueError as exc:
        raise AdapterRefused(f"adapter {adapter.name}: adapter_config.json is not JSON ({exc})") from None
    if not isinstance(config, dict) or str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterRefused(f"adapter {adapter.name}: adapter_config.json is not a LoRA adapter's")
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise AdapterRefused(f"adapter {adapter.name}: adapter_config.json has no rank (r)")
    if rank > max_rank:
        raise AdapterRefused(
            f"adapter {adapter.name} has rank {rank}, above its base's lora.max_rank {max_rank}; "
            "raise the base's lora.max_rank"
        )
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise AdapterRefused(f"adapter {adapter.name}: no {' or '.join(WEIGHT_FILES)} in {folder}")
