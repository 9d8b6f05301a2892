"""Pooling jobs as the front door writes them, and their answers' rows, for worker tests."""

from __future__ import annotations

import time
import uuid

import numpy as np
import numpy.typing as npt

from switchboard.wire import Chunk, Job, PoolingTask, Prompt, SamplingParams


def pooling_job(model: str, task: PoolingTask, deadline_s: float = 60.0) -> Job:
    """A pooling job for `model`."""
    now = time.time()
    return Job(
        id=uuid.uuid4().hex,
        model=model,
        sampling=SamplingParams(),
        pooling=task,
        created=now,
        deadline=now + deadline_s,
    )


def embed_job(model: str, *inputs: Prompt, deadline_s: float = 60.0, **options: object) -> Job:
    """An embeddings job of `inputs` for `model`."""
    return pooling_job(model, PoolingTask(task="embed", inputs=inputs, **options), deadline_s)  # type: ignore[arg-type]


def rows(chunk: Chunk) -> list[npt.NDArray[np.float32]]:
    """The answer's rows, as float32 vectors."""
    assert chunk.error is None, chunk.error
    return [np.frombuffer(row, dtype="<f4") for row in chunk.pooled]


def cosine(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
