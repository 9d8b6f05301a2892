"""What a Hugging Face model folder says about the memory a model takes, read without loading it.

Footprints are estimated before a model is loaded (at worker start, for placement), so this reads
the files alone: the weights' sizes and `config.json`, never torch or transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Bytes per element of the dtypes a config or a setting names.
DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "fp32": 4,
    "float16": 2,
    "half": 2,
    "fp16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "fp8": 1,
    "float8": 1,
    "int8": 1,
    "nvfp4": 0.5,
}
# Where a config's context length may be written, in the order transformers' configs use them.
CONTEXT_LENGTH_KEYS = ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions")


def weights_bytes(model_dir: Path) -> int:
    """The size of the model's weight files (safetensors, else PyTorch's), 0 if there are none."""
    for pattern in ("*.safetensors", "*.bin", "*.pt"):
        files = list(Path(model_dir).glob(pattern))
        if files:
            return sum(f.stat().st_size for f in files)
    return 0


def read_config(model_dir: Path) -> dict[str, Any]:
    """The model's `config.json` (a multimodal model's text part where it has one); {} without one."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return {}
    config = json.loads(path.read_text())
    text_config = config.get("text_config")
    if isinstance(text_config, dict):
        return {**config, **text_config}
    return dict(config)


def context_length(config: dict[str, Any]) -> int | None:
    """The context length the model was trained for, as its config says."""
    for key in CONTEXT_LENGTH_KEYS:
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def model_dtype_bytes(config: dict[str, Any], dtype: str = "auto") -> float:
    """Bytes per element of the model's weights and activations: `dtype`, or the config's own."""
    name = dtype if dtype != "auto" else str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return DTYPE_BYTES.get(name.removeprefix("torch.").lower(), 2)


def kv_bytes_per_token(config: dict[str, Any], element_bytes: float) -> int | None:
    """What one token occupies in the KV cache (keys and values of every layer); None if unknown.

    Standard attention only: a config without the usual head counts (MLA, hybrid models) gets None,
    and its KV cache is then sized in bytes, never from a token count.
    """
    layers = config.get("num_hidden_layers")
    heads = config.get("num_attention_heads")
    if not isinstance(layers, int) or not isinstance(heads, int) or heads <= 0:
        return None
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim")
    if not isinstance(head_dim, int):
        hidden = config.get("hidden_size")
        if not isinstance(hidden, int):
            return None
        head_dim = hidden // heads
    return int(2 * layers * kv_heads * head_dim * element_bytes)
