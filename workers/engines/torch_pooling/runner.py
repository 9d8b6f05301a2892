"""The PyTorch pooling runner: one embedder, classifier or cross-encoder reranker, loaded and run.

Loads a Hugging Face folder with transformers (`AutoModel` for an embedder,
`AutoModelForSequenceClassification` for a classifier or a reranker), float32, on the GPU where
there is one. Each `pool_now` call runs the rows of every job Triton batched together: sorted by
length into sub-batches that waste little padding, each one forward pass. It runs in the model's own
process (`process`), so that its Python glue between torch's kernels never waits for the
worker's event loop to let go of a GIL they would share.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from switchboard.config import ModelConfig
from switchboard.wire import ModelLimits
from workers.engines.base import InvalidEngineRequest, PooledRow, PoolingRow
from workers.engines.prompts import longest_token_chars
from workers.engines.torch_pooling.heads import (
    Vector,
    classifier_values,
    declared_pooling,
    embedding_values,
    pool_hidden,
    reranker_values,
    row_bytes,
)
from workers.engines.torch_pooling.inputs import EncodedRow, RowEncoder

logger = logging.getLogger(__name__)

# Padded tokens (rows times the longest row) one forward pass takes at most: it bounds the activations'
# memory, whatever the batch's lengths.
TOKEN_BUDGET = 8192
# A sub-batch's longest row may be this many times its shortest (plus a little): sorted by length,
# rows of very different lengths go into different passes instead of padding the short ones.
LENGTH_SPREAD = 2.0
LENGTH_SLACK = 16

# transformers imports its classes lazily, and two threads importing the same one at once can fail
# ("cannot import name 'AutoModel'"): two pooling models loading together in one process.
_IMPORT_LOCK = threading.Lock()


def import_runtime() -> Any:
    """transformers' model and tokenizer classes, imported once, by one thread at a time."""
    with _IMPORT_LOCK:
        import transformers
        from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer  # noqa: F401

        return transformers


class LoadedModel(msgspec.Struct, frozen=True, kw_only=True):
    """What the worker learns of a pooling model once its runner has loaded it."""

    device: str
    memory_bytes: int  # its parameters and buffers
    limits: ModelLimits
    labels: tuple[str, ...] = ()  # a classifier's, in the order of its probabilities


class PoolingRunner:
    """One pooling model in this process: `load` it, then `pool_now` batch after batch (one at a time)."""

    def __init__(self, model: ModelConfig) -> None:
        self.model = model
        self._model: Any = None
        self._encoder: RowEncoder | None = None
        self._pooling = declared_pooling(Path(model.path)) if model.kind == "embed" else "mean"
        self._device = "cpu"
        self._pad_id = 0
        self._dimensions = 0  # an embedding's size, once loaded

    def pool_now(self, rows: list[PoolingRow]) -> list[PooledRow | InvalidEngineRequest]:
        """Each row's answer, or its refusal, in the rows' order."""
        assert self._encoder is not None
        answers: list[PooledRow | InvalidEngineRequest | None] = [self._refusal(row) for row in rows]
        allowed = [index for index, answer in enumerate(answers) if answer is None]
        encoded: dict[int, EncodedRow] = {}
        for index, encoding in zip(
            allowed, self._encoder.encode_all([rows[i] for i in allowed]), strict=True
        ):
            if isinstance(encoding, InvalidEngineRequest):
                answers[index] = encoding
            else:
                encoded[index] = encoding
        outputs = self._forward_all(encoded)
        for index, output in outputs.items():
            values = self._values(output, rows[index])
            answers[index] = PooledRow(values=row_bytes(values), prompt_tokens=len(encoded[index].ids))
        return [answer for answer in answers if answer is not None]

    def _refusal(self, row: PoolingRow) -> InvalidEngineRequest | None:
        """Why the model cannot take the row whatever its input, if it cannot."""
        if row.task != self.model.kind:
            return InvalidEngineRequest(
                f"{self.model.name} is a {self.model.kind!r} model; it cannot {row.task!r}.", param="model"
            )
        if row.dimensions is not None and row.dimensions > self._dimensions:
            return InvalidEngineRequest(
                f"{self.model.name} makes embeddings of {self._dimensions} dimensions; `dimensions` "
                f"cannot ask for more ({row.dimensions}).",
                param="dimensions",
            )
        return None

    def _values(self, output: Vector, row: PoolingRow) -> Vector:
        if row.task == "embed":
            return embedding_values(output, row)
        if row.task == "classify":
            return classifier_values(output)
        return reranker_values(output)

    def _forward_all(self, encoded: dict[int, EncodedRow]) -> dict[int, Vector]:
        """Every row's raw output (pooled vector or logits), sub-batch by sub-batch."""
        order = sorted(encoded, key=lambda index: len(encoded[index].ids))
        lengths = [len(encoded[index].ids) for index in order]
        outputs: dict[int, Vector] = {}
        for start, end in sub_batches(lengths, max_rows=self.model.batching.max_batch_size):
            indices = order[start:end]
            for index, output in zip(indices, self._forward([encoded[i] for i in indices]), strict=True):
                outputs[index] = output
        return outputs

    def _forward(self, rows: list[EncodedRow]) -> Vector:
        """One pass over right-padded rows: pooled vectors (embedder) or logits, one per row."""
        import torch

        longest = max(len(row.ids) for row in rows)
        pad = self._pad_id
        ids = torch.tensor([row.ids + [pad] * (longest - len(row.ids)) for row in rows])
        mask = torch.tensor([[1] * len(row.ids) + [0] * (longest - len(row.ids)) for row in rows])
        inputs: dict[str, Any] = {"input_ids": ids.to(self._device), "attention_mask": mask.to(self._device)}
        if rows[0].types is not None:
            types = [(row.types or []) + [0] * (longest - len(row.ids)) for row in rows]
            inputs["token_type_ids"] = torch.tensor(types).to(self._device)
        with torch.inference_mode():
            output = self._model(**inputs)
            if self.model.kind == "embed":
                result = pool_hidden(output.last_hidden_state, inputs["attention_mask"], self._pooling)
            else:
                result = output.logits
            return np.asarray(result.float().cpu().numpy())

    # --- loading ----------------------------------------------------------------------------

    def load(self) -> LoadedModel:
        """Load the model and its tokenizer; what the worker needs to know of it."""
        import torch

        transformers = import_runtime()
        path = self.model.path
        self._device = device()
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        loader = (
            transformers.AutoModel
            if self.model.kind == "embed"
            else transformers.AutoModelForSequenceClassification
        )
        model = loader.from_pretrained(path, dtype=torch.float32).to(self._device).eval()
        config = model.config
        if self.model.kind == "score" and config.num_labels != 1:
            raise ValueError(
                f"{self.model.name}: a reranker has one output label; this model has {config.num_labels}"
            )
        labels: tuple[str, ...] = ()
        if self.model.kind == "classify":
            labels = tuple(str(config.id2label[i]) for i in range(config.num_labels))
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._dimensions = int(config.hidden_size)
        limits = ModelLimits(
            max_model_len=_max_model_len(config, tokenizer),
            vocab_size=int(config.vocab_size),
            max_token_chars=longest_token_chars(tokenizer),
            embedding_size=self._dimensions if self.model.kind == "embed" else None,
        )
        # The encoder checks lengths itself; transformers would warn of every long input as well.
        tokenizer.model_max_length = 2**31 - 1
        self._encoder = RowEncoder(tokenizer, model_name=self.model.name, limits=limits)
        tensors = [*model.parameters(), *model.buffers()]
        self._model = model
        logger.info(
            "pooling model loaded",
            extra={"model": self.model.name, "kind": self.model.kind, "device": self._device},
        )
        return LoadedModel(
            device=self._device,
            memory_bytes=sum(t.numel() * t.element_size() for t in tensors),
            limits=limits,
            labels=labels,
        )


def sub_batches(lengths: Sequence[int], *, max_rows: int) -> list[tuple[int, int]]:
    """Cut rows sorted by length into passes: [start, end) ranges of at most `max_rows` rows, each
    padded to its longest within TOKEN_BUDGET, and its longest within LENGTH_SPREAD of its shortest."""
    ranges: list[tuple[int, int]] = []
    start = 0
    for end in range(1, len(lengths) + 1):
        if end == len(lengths):
            ranges.append((start, end))
            break
        rows, longest, shortest = end - start + 1, lengths[end], lengths[start]
        too_many = rows > max_rows or rows * longest > TOKEN_BUDGET
        too_spread = longest > LENGTH_SPREAD * shortest + LENGTH_SLACK
        if too_many or too_spread:
            ranges.append((start, end))
            start = end
    return ranges


def _max_model_len(config: Any, tokenizer: Any) -> int:
    """The longest input: the model's positions, or less where its tokenizer says so (RoBERTa-like
    models keep two positions for padding)."""
    positions = int(getattr(config, "max_position_embeddings", 0) or 0)
    declared = int(getattr(tokenizer, "model_max_length", 0) or 0)
    if positions <= 0:
        return declared
    return min(positions, declared) if 0 < declared < 1_000_000 else positions


def device() -> str:
    """Where a pooling model computes: the GPU where there is one."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
