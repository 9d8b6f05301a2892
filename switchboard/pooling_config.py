"""What kind of model a configured model is, and how Triton batches the pooling kinds.

A generator streams text (chat and completions). The pooling kinds answer once, one row per input:
an embedder (`/v1/embeddings`), a classifier (`/classify`) and a reranker, a cross-encoder that
scores each document against a query (`/v1/rerank`). Their throughput depends on batching, so the
worker's Triton model for one of them declares Triton's dynamic batcher (`BatchingConfig`).
Part of `switchboard.config.ModelConfig`.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

ModelKind = Literal["generate", "embed", "classify", "score"]
POOLING_KINDS: tuple[ModelKind, ...] = ("embed", "classify", "score")

EngineName = Literal["vllm", "trtllm", "torch"]
# The engine a model runs on when its entry names none. The pooling kinds run on a plain PyTorch
# runner inside the worker's Triton model (README's embeddings section says why, with figures).
DEFAULT_ENGINE: dict[ModelKind, EngineName] = {
    "generate": "vllm",
    "embed": "torch",
    "classify": "torch",
    "score": "torch",
}
ENGINES_OF_KIND: dict[ModelKind, tuple[EngineName, ...]] = {
    "generate": ("vllm", "trtllm"),
    "embed": ("torch",),
    "classify": ("torch",),
    "score": ("torch",),
}


class BatchingConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How Triton's dynamic batcher groups a pooling model's requests into one engine call.

    A request waits at most `queue_delay_ms` for others to join it; a batch that reaches one of
    `preferred_batch_sizes` leaves at once. Rows count, not requests: a job of 10 inputs is 10 rows.
    """

    # false: every request runs alone (Triton's default scheduler), for comparison.
    enabled: bool = True
    max_batch_size: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 64
    preferred_batch_sizes: list[Annotated[int, msgspec.Meta(ge=1)]] = msgspec.field(
        default_factory=lambda: [16, 32, 64]
    )
    # The usual window is 5-20 ms: long enough for a burst to meet, short enough for one request.
    queue_delay_ms: Annotated[float, msgspec.Meta(ge=0, le=1000)] = 5.0
    # Triton instances of the model (batching on or off). Each hands its batch to the model's one
    # process, which computes one batch at a time: with two, the next batch is gathered, handed
    # over and waiting while one computes, and the answers of one go back while the next computes.
    instances: Annotated[int, msgspec.Meta(ge=1, le=8)] = 2


class PoolingConfigError(ValueError):
    """A model's kind, engine and batching do not fit together; the message says what to change."""


def check_pooling(
    name: str, kind: ModelKind, engine: EngineName, batching: BatchingConfig, dimensions: list[int] | None
) -> None:
    """Raise PoolingConfigError where a model's kind and the settings that go with it disagree."""
    allowed = ENGINES_OF_KIND[kind]
    if engine not in allowed:
        raise PoolingConfigError(
            f"model {name!r}: a {kind!r} model runs on engine {' or '.join(map(repr, allowed))}, "
            f"not {engine!r}"
        )
    too_big = [size for size in batching.preferred_batch_sizes if size > batching.max_batch_size]
    if too_big:
        raise PoolingConfigError(
            f"model {name!r}: batching.preferred_batch_sizes {too_big} exceed "
            f"batching.max_batch_size ({batching.max_batch_size})"
        )
    if dimensions is not None and kind != "embed":
        raise PoolingConfigError(f"model {name!r}: matryoshka_dimensions is for embedders only")
    if dimensions is not None and any(size < 1 for size in dimensions):
        raise PoolingConfigError(f"model {name!r}: matryoshka_dimensions must be positive")
