"""The bad requests of the pooling endpoints (issue 37), each with the parameter its 400 names.

Keyed by a name that says what is wrong: (path, JSON body, `param` of OpenAI's error object). Some are
refused by the front door before anything is queued, some by the worker (a token id past the
vocabulary, more dimensions than the model has); all must arrive as a 400 in OpenAI's shape.
"""

from __future__ import annotations

from typing import Any

from switchboard.local.demo_pooling_models import (
    DEMO_CLASSIFIER_NAME,
    DEMO_EMBEDDER_NAME,
    DEMO_RERANKER_NAME,
    HIDDEN_SIZE,
)
from tests.support.stack import MODEL

EMBEDDER, CLASSIFIER, RERANKER = DEMO_EMBEDDER_NAME, DEMO_CLASSIFIER_NAME, DEMO_RERANKER_NAME
# The same embedder as EMBEDDER, configured without `matryoshka_dimensions`: `dimensions` is refused.
WHOLE_EMBEDDER = "switchboard-demo-embed-whole"
# Well past the demo models' 512 positions.
TOO_LONG = " ".join(["the quick brown fox"] * 200)
BAD_REQUESTS: dict[str, tuple[str, dict[str, Any], str]] = {
    "empty text": ("/v1/embeddings", {"model": EMBEDDER, "input": ""}, "input"),
    "empty list": ("/v1/embeddings", {"model": EMBEDDER, "input": []}, "input"),
    "not text nor token ids": ("/v1/embeddings", {"model": EMBEDDER, "input": [{"text": "hi"}]}, "input[0]"),
    "past 2048 inputs": ("/v1/embeddings", {"model": EMBEDDER, "input": ["hi"] * 2049}, "input"),
    "negative token id": ("/v1/embeddings", {"model": EMBEDDER, "input": [5, -1]}, "input[1]"),
    "token id past the vocabulary": ("/v1/embeddings", {"model": EMBEDDER, "input": [5, 100_000]}, "input"),
    "past the context": ("/v1/embeddings", {"model": EMBEDDER, "input": TOO_LONG}, "input"),
    "unknown encoding": (
        "/v1/embeddings",
        {"model": EMBEDDER, "input": "hi", "encoding_format": "hex"},
        "encoding_format",
    ),
    "dimensions of a whole-only model": (
        "/v1/embeddings",
        {"model": WHOLE_EMBEDDER, "input": "hi", "dimensions": 32},
        "dimensions",
    ),
    "no dimensions": ("/v1/embeddings", {"model": EMBEDDER, "input": "hi", "dimensions": 0}, "dimensions"),
    "more dimensions than the model has": (
        "/v1/embeddings",
        {"model": EMBEDDER, "input": "hi", "dimensions": HIDDEN_SIZE + 1},
        "dimensions",
    ),
    "truncation to nothing": (
        "/v1/embeddings",
        {"model": EMBEDDER, "input": "hi", "truncate_prompt_tokens": 0},
        "truncate_prompt_tokens",
    ),
    "embeddings of an LLM": ("/v1/embeddings", {"model": MODEL, "input": "hi"}, "model"),
    "chat with an embedder": (
        "/v1/chat/completions",
        {"model": EMBEDDER, "messages": [{"role": "user", "content": "hi"}]},
        "model",
    ),
    "completion of a classifier": ("/v1/completions", {"model": CLASSIFIER, "prompt": "hi"}, "model"),
    "classify with an embedder": ("/classify", {"model": EMBEDDER, "input": "hi"}, "model"),
    "empty classify input": ("/classify", {"model": CLASSIFIER, "input": ""}, "input"),
    "empty query": ("/v1/rerank", {"model": RERANKER, "query": "", "documents": ["a"]}, "query"),
    "no documents": ("/v1/rerank", {"model": RERANKER, "query": "a", "documents": []}, "documents"),
    "negative top_n": (
        "/v1/rerank",
        {"model": RERANKER, "query": "a", "documents": ["b"], "top_n": -1},
        "top_n",
    ),
    "rerank with a classifier": (
        "/v1/rerank",
        {"model": CLASSIFIER, "query": "a", "documents": ["b"]},
        "model",
    ),
}
