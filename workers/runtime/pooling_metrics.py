"""The pooling models' own metrics: how Triton's dynamic batcher groups their rows, and what they read.

Recorded by each pooling model's Triton callable in the worker's process, on the worker's registry
(served with the others by `workers.runtime.metrics_server`).
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
