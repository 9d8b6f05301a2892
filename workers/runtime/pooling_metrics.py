"""The pooling models' own metrics: how Triton's dynamic batcher groups their rows, and what they read.

Recorded by the worker's client of each pooling model (`workers.triton.pooling.client`) from every
answered request, on the worker's registry (served with the others by
`workers.runtime.metrics_server`): the batch a request rode in comes back with its answer, from the
model's Triton stub (`workers.triton.pooling.backend`).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from switchboard.metrics import REGISTRY

# Rows per engine call: 1 up to the largest `batching.max_batch_size` anyone sets.
BATCH_ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
# The batcher's window is a few milliseconds; a busy model's queue holds requests longer.
BATCHER_WAIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

POOLING_BATCH_ROWS = Histogram(
    "switchboard:pooling_batch_rows",
    "Rows a pooling model's engine computed in one call: the inputs of every request Triton's dynamic "
    "batcher grouped together, by model.",
    ["model"],
    buckets=BATCH_ROW_BUCKETS,
    registry=REGISTRY,
)
POOLING_BATCHER_WAIT = Histogram(
    "switchboard:pooling_batcher_wait_seconds",
    "From the worker sending a pooling request to its Triton model until the batch it rode in reached "
    "the engine: the time held in Triton's dynamic batcher (and its queue while the engine was busy), "
    "by model.",
    ["model"],
    buckets=BATCHER_WAIT_BUCKETS,
    registry=REGISTRY,
)
POOLING_REQUESTS = Counter(
    "switchboard:pooling_requests",
    "Requests a pooling model's Triton model answered (a job, or a part of a job larger than a batch), by model.",
    ["model"],
    registry=REGISTRY,
)
POOLING_ROWS = Counter(
    "switchboard:pooling_rows", "Inputs a pooling model answered, by model.", ["model"], registry=REGISTRY
)
POOLING_INPUT_TOKENS = Counter(
    "switchboard:pooling_input_tokens",
    "Tokens a pooling model read (a reranker's query once per document), by model.",
    ["model"],
    registry=REGISTRY,
)


class PoolingMetrics:
    """One pooling model's series."""

    def __init__(self, model: str) -> None:
        self._batch_rows = POOLING_BATCH_ROWS.labels(model)
        self._batcher_wait = POOLING_BATCHER_WAIT.labels(model)
        self._requests = POOLING_REQUESTS.labels(model)
        self._rows = POOLING_ROWS.labels(model)
        self._tokens = POOLING_INPUT_TOKENS.labels(model)

    def answered(self, *, rows: int, tokens: int) -> None:
        """One request answered: its rows, and the tokens the model read for them."""
        self._requests.inc()
        self._rows.inc(rows)
        self._tokens.inc(tokens)

    def batch(self, *, rows: int, held_s: float, first_of_batch: bool) -> None:
        """The batch a request rode in: its rows (counted once per batch), and how long the request
        was held before the batch ran."""
        self._batcher_wait.observe(held_s)
        if first_of_batch:
            self._batch_rows.observe(rows)
