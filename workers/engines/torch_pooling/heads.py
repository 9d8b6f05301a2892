"""From a model's outputs to each row's values: an embedder's pooling, a classifier's and a reranker's heads.

An embedder pools its last hidden states over the row's own tokens, the way its folder declares it
(sentence-transformers' `modules.json` → `1_Pooling/config.json`: cls, mean or last token; mean
where nothing is declared), then keeps the first `dimensions` and scales to unit length when asked.
A classifier's logits become softmax probabilities; a reranker's one logit becomes a sigmoid score.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt

from workers.engines.base import PoolingRow

if TYPE_CHECKING:
    import torch

# One row's values, or a batch's outputs.
Vector = npt.NDArray[np.float32]

PoolingMode = Literal["cls", "mean", "lasttoken"]

# sentence-transformers' pooling config keys, by the mode they switch on (in the order it reads them).
_MODE_KEYS: tuple[tuple[str, PoolingMode], ...] = (
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_lasttoken", "lasttoken"),
)


def declared_pooling(model_dir: Path) -> PoolingMode:
    """The pooling a sentence-transformers folder declares; mean where it declares none we know."""
    modules_file = Path(model_dir) / "modules.json"
    if not modules_file.is_file():
        return "mean"
    modules = json.loads(modules_file.read_text())
    for module in modules:
        if str(module.get("type", "")).endswith(".Pooling"):
            config_file = Path(model_dir) / str(module.get("path", "")) / "config.json"
            if config_file.is_file():
                config = json.loads(config_file.read_text())
                for key, mode in _MODE_KEYS:
                    if config.get(key):
                        return mode
    return "mean"


def pool_hidden(hidden: torch.Tensor, mask: torch.Tensor, mode: PoolingMode) -> torch.Tensor:
    """One vector per row of right-padded `hidden` (rows, tokens, width), over its `mask`."""
    if mode == "cls":
        return hidden[:, 0]
    if mode == "lasttoken":
        last = mask.sum(dim=1) - 1
        return hidden[range(hidden.shape[0]), last]
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


def embedding_values(vector: Vector, row: PoolingRow) -> Vector:
    """A row's embedding: cut to its `dimensions`, scaled to unit length when it asks."""
    if row.dimensions is not None:
        vector = vector[: row.dimensions]
    if row.normalize:
        norm = float(np.linalg.norm(vector))
        vector = vector / norm if norm > 0 else vector
    return vector


def classifier_values(logits: Vector) -> Vector:
    """Softmax probabilities, one per label."""
    shifted = np.exp(logits - logits.max())
    return np.asarray(shifted / shifted.sum(), dtype=np.float32)


def reranker_values(logits: Vector) -> Vector:
    """The one relevance score: the sigmoid of the one logit (as sentence-transformers' CrossEncoder)."""
    return np.asarray(1.0 / (1.0 + np.exp(-logits[:1])), dtype=np.float32)


def row_bytes(values: Vector) -> bytes:
    """Values as the job's answer carries them: little-endian float32."""
    return np.asarray(values, dtype="<f4").tobytes()
