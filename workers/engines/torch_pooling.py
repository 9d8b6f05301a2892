"""The PyTorch pooling runner: an embedder, a classifier or a cross-encoder reranker in this process.

Loads a Hugging Face folder with transformers (`AutoModel` for an embedder,
`AutoModelForSequenceClassification` for a classifier or a reranker), float32, on the GPU where
there is one. Each `pool` call runs the rows of every job Triton batched together: sorted by length
into sub-batches that waste little padding, each one forward pass. The work runs on one thread of the
engine's own, off the event loop (torch releases the GIL while it computes), pinned to the cores the
worker placed the model on, with as many intra-op threads as those cores.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from switchboard.config import ModelConfig
from switchboard.wire import ModelLimits
from workers.engines.base import Footprint, InvalidEngineRequest, PooledRow, PoolingEngine, PoolingRow
from workers.engines.model_files import DTYPE_BYTES, read_config, weights_bytes
from workers.engines.prompts import longest_token_chars
from workers.engines.torch_pooling_heads import (
    Vector,
    classifier_values,
    declared_pooling,
    embedding_values,
    pool_hidden,
    reranker_values,
    row_bytes,
)
from workers.engines.torch_pooling_inputs import EncodedRow, RowEncoder
from workers.runtime.cpu_placement import parse_cpu_list

logger = logging.getLogger(__name__)

# Padded tokens (rows times the longest row) one forward pass takes at most: it bounds the activations'
# memory, whatever the batch's lengths.
TOKEN_BUDGET = 8192
# A sub-batch's longest row may be this many times its shortest (plus a little): sorted by length,
# rows of very different lengths go into different passes instead of padding the short ones.
LENGTH_SPREAD = 2.0
LENGTH_SLACK = 16
# Float32 values per token of a pass alive at once, in hidden widths (a layer's query, key, value and
# output projections, the feed-forward's four-times-wider one, residuals), beside the attention scores.
ACTIVATION_WIDTHS = 12
# Jobs the worker may take at once for a pooling model, per row of its largest batch: enough for the
# batcher to fill a batch while the previous one computes.
JOBS_PER_BATCH_ROW = 2


# transformers imports its classes lazily, and two threads importing the same one at once can fail
# ("cannot import name 'AutoModel'"): two pooling models loading together, or a load beside the
# worker's own import at start.
_IMPORT_LOCK = threading.Lock()


def import_runtime() -> Any:
    """transformers' model and tokenizer classes, imported once, by one thread at a time."""
    with _IMPORT_LOCK:
        import transformers
        from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer  # noqa: F401

        return transformers


class TorchPoolingEngine(PoolingEngine):
    """One pooling model, run by PyTorch in the worker's process."""

    def __init__(self, model: ModelConfig, *, cpu_threads: str | None = None) -> None:
        super().__init__(model)
        self._cpu_threads = cpu_threads
        self._executor: ThreadPoolExecutor | None = None
        self._model: Any = None
        self._encoder: RowEncoder | None = None
        self._labels: tuple[str, ...] = ()
        self._pooling = declared_pooling(Path(model.path)) if model.kind == "embed" else "mean"
        self._device = "cpu"
        self._memory_bytes = 0
        self._pad_id = 0
        self._dimensions = 0  # an embedding's size, once loaded

    # --- the Engine's life ------------------------------------------------------------------

    async def start(self) -> None:
        """Load the model and its tokenizer on the engine's own thread."""
        self._executor = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix=f"pooling-{self.model.name}",
            initializer=_compute_on,
            initargs=(self._cpu_threads,),
        )
        await asyncio.wrap_future(self._executor.submit(self._load))

    async def stop(self) -> None:
        """Drop the model; the thread ends once a pass in progress has."""
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, wait=True)
        self._model = None
        self._encoder = None
        if self._device == "cuda":
            import torch

            torch.cuda.empty_cache()

    def footprint(self) -> Footprint:
        """Started: the parameters' bytes and a largest pass's activations; before, the same from its files."""
        config = read_config(Path(self.model.path))
        if self._model is not None:
            return Footprint(device=self._device, memory_bytes=self._memory_bytes + _activation_bytes(config))
        dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
        as_float32 = weights_bytes(Path(self.model.path)) * 4 / DTYPE_BYTES.get(dtype, 4)
        return Footprint(device=_device(), memory_bytes=int(as_float32) + _activation_bytes(config))

    def limits(self) -> ModelLimits | None:
        """The longest input, the vocabulary and the longest token, once loaded."""
        return self._encoder.limits if self._encoder is not None else None

    def max_sequences(self) -> int | None:
        """Jobs at once: two of the largest batch's rows each, so that the batcher has the next batch
        waiting while one computes."""
        return JOBS_PER_BATCH_ROW * self.model.batching.max_batch_size

    def labels(self) -> tuple[str, ...]:
        """A classifier's label names, in the order of its probabilities."""
        return self._labels

    # --- pooling ----------------------------------------------------------------------------

    async def pool(self, rows: Sequence[PoolingRow]) -> list[PooledRow | InvalidEngineRequest]:
        """Each row's answer, or its refusal, computed on the engine's thread."""
        if self._executor is None or self._encoder is None:
            raise RuntimeError(f"{self.model.name} is not started")
        return await asyncio.wrap_future(self._executor.submit(self._pool_now, list(rows)))

    def _pool_now(self, rows: list[PoolingRow]) -> list[PooledRow | InvalidEngineRequest]:
        assert self._encoder is not None
        answers: list[PooledRow | InvalidEngineRequest | None] = [None] * len(rows)
        encoded: dict[int, EncodedRow] = {}
        for index, row in enumerate(rows):
            try:
                encoded[index] = self._encode(row)
            except InvalidEngineRequest as refusal:
                answers[index] = refusal
        outputs = self._forward_all(encoded)
        for index, output in outputs.items():
            values = self._values(output, rows[index])
            answers[index] = PooledRow(values=row_bytes(values), prompt_tokens=len(encoded[index].ids))
        return [answer for answer in answers if answer is not None]

    def _encode(self, row: PoolingRow) -> EncodedRow:
        assert self._encoder is not None
        if row.task != self.model.kind:
            raise InvalidEngineRequest(
                f"{self.model.name} is a {self.model.kind!r} model; it cannot {row.task!r}.", param="model"
            )
        if row.dimensions is not None and row.dimensions > self._dimensions:
            raise InvalidEngineRequest(
                f"{self.model.name} makes embeddings of {self._dimensions} dimensions; `dimensions` "
                f"cannot ask for more ({row.dimensions}).",
                param="dimensions",
            )
        return self._encoder.encode(row)

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

    def _load(self) -> None:
        import torch

        transformers = import_runtime()
        path = self.model.path
        self._device = _device()
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
        if self.model.kind == "classify":
            self._labels = tuple(str(config.id2label[i]) for i in range(config.num_labels))
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._dimensions = int(config.hidden_size)
        limits = ModelLimits(
            max_model_len=_max_model_len(config, tokenizer),
            vocab_size=int(config.vocab_size),
            max_token_chars=longest_token_chars(tokenizer),
        )
        # The encoder checks lengths itself; transformers would warn of every long input as well.
        tokenizer.model_max_length = 2**31 - 1
        self._encoder = RowEncoder(tokenizer, model_name=self.model.name, limits=limits)
        tensors = [*model.parameters(), *model.buffers()]
        self._memory_bytes = sum(t.numel() * t.element_size() for t in tensors)
        self._model = model
        logger.info(
            "pooling model loaded",
            extra={"model": self.model.name, "kind": self.model.kind, "device": self._device},
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


def _activation_bytes(config: dict[str, Any]) -> int:
    """What the largest pass's activations take: TOKEN_BUDGET tokens through the widest layer, and
    their attention scores over the longest input."""
    width = int(config.get("hidden_size") or 768)
    heads = int(config.get("num_attention_heads") or 12)
    positions = int(config.get("max_position_embeddings") or 512)
    return TOKEN_BUDGET * 4 * (width * ACTIVATION_WIDTHS + 2 * heads * positions)


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _compute_on(cpu_threads: str | None) -> None:
    """Pin the engine's thread (and the intra-op threads it starts) to its cores, as many threads as
    cores; without a placement, torch's defaults."""
    if not cpu_threads:
        return
    import torch

    cores = parse_cpu_list(cpu_threads)
    try:
        os.sched_setaffinity(0, cores)  # this thread only (Linux)
    except OSError:
        logger.warning("cannot pin the pooling thread", extra={"cores": cpu_threads}, exc_info=True)
    torch.set_num_threads(len(cores))
