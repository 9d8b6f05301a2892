"""Tiny LoRA adapters of the demo model, built offline with `peft` (random weights, no downloads).

`build_adapter` writes a PEFT adapter folder (`adapter_config.json`, `adapter_model.safetensors`)
whose low-rank update is large enough that greedy answers differ from the base's; `build_merged`
writes the base with that adapter merged into its weights, a whole model that must answer exactly as
the base with the adapter does. Both are cached by content, so a test session builds each once.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

# The demo model's projections that an adapter updates: every attention and MLP matrix.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MARKER_NAME = ".switchboard-test-adapter"


def build_adapter(base_dir: Path, target_dir: Path, *, seed: int, rank: int = 8) -> Path:
    """A LoRA adapter of the model in `base_dir`, with random A and B (seeded), into `target_dir`."""
    target_dir = Path(target_dir)
    if _is_complete(target_dir):
        return target_dir
    model = _peft_model(base_dir, seed=seed, rank=rank)
    scratch = _scratch(target_dir)
    model.save_pretrained(scratch, safe_serialization=True)
    _finish(scratch, target_dir)
    return target_dir


def build_merged(base_dir: Path, adapter_dir: Path, target_dir: Path) -> Path:
    """The model in `base_dir` with the adapter in `adapter_dir` merged into its weights."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from switchboard.local.demo_model import save_quietly

    target_dir = Path(target_dir)
    if _is_complete(target_dir):
        return target_dir
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype="float32")
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    scratch = _scratch(target_dir)
    save_quietly(merged, AutoTokenizer.from_pretrained(base_dir), scratch)
    _finish(scratch, target_dir)
    return target_dir


def break_adapter(adapter_dir: Path, target_dir: Path) -> Path:
    """A copy of an adapter whose weights file is cut short: its load must fail."""
    shutil.copytree(adapter_dir, target_dir, dirs_exist_ok=True)
    weights = target_dir / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    return target_dir


def adapter_rank(adapter_dir: Path) -> int:
    """The rank an adapter folder declares."""
    return int(json.loads((Path(adapter_dir) / "adapter_config.json").read_text())["r"])


def _peft_model(base_dir: Path, *, seed: int, rank: int) -> Any:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype="float32")
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=list(TARGET_MODULES),
        # peft starts B at zero (the adapter changes nothing); a test adapter must change answers.
        init_lora_weights=False,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = get_peft_model(base, config)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_" in name:
                    parameter.normal_(0.0, 0.15)
    return model


def _scratch(target_dir: Path) -> Path:
    scratch = target_dir.with_name(f".{target_dir.name}.partial")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.parent.mkdir(parents=True, exist_ok=True)
    return scratch


def _finish(scratch: Path, target_dir: Path) -> None:
    (scratch / MARKER_NAME).write_text("1\n")
    shutil.rmtree(target_dir, ignore_errors=True)
    scratch.rename(target_dir)


def _is_complete(folder: Path) -> bool:
    return (folder / MARKER_NAME).is_file()
