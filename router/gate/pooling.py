"""The gates of the pooling endpoints: embeddings, classification and rerank.

Their checks (`router.openai.pooling_checks`) bound the inputs' number and size before anything is
queued. What needs the model (its kind, its dimensions) is checked once the model is known, still
before anything is queued (`router.pooling_flow`).
"""

from __future__ import annotations

import msgspec

from router.gate.asks import ClassificationAsk, EmbeddingsAsk, RerankAsk
from router.gate.gate import Gate
from router.openai.classify import ClassificationRequest
from router.openai.embeddings import EmbeddingRequest
from router.openai.pooling_checks import (
    check_activation,
    check_encoding_format,
    check_query,
    check_truncation,
    pooling_inputs,
    rerank_documents,
)
from router.openai.rerank import RerankRequest
from switchboard.router_config import RouterConfig


def checked_embeddings(body: EmbeddingRequest, bounds: RouterConfig) -> EmbeddingsAsk:
    inputs = pooling_inputs(body.input)
    check_encoding_format(body.encoding_format)
    check_truncation(body.truncate_prompt_tokens)
    return EmbeddingsAsk(body, inputs)


def checked_classification(body: ClassificationRequest, bounds: RouterConfig) -> ClassificationAsk:
    inputs = pooling_inputs(body.input)
    check_truncation(body.truncate_prompt_tokens)
    check_activation(body.use_activation)
    return ClassificationAsk(body, inputs)


def checked_rerank(body: RerankRequest, bounds: RouterConfig) -> RerankAsk:
    check_query(body.query)
    documents = rerank_documents(body.documents)
    check_truncation(body.truncate_prompt_tokens)
    check_activation(body.use_activation)
    return RerankAsk(body, documents)


EMBEDDINGS = Gate("embeddings", msgspec.json.Decoder(EmbeddingRequest), checked_embeddings)
CLASSIFY = Gate("classification", msgspec.json.Decoder(ClassificationRequest), checked_classification)
RERANK = Gate("rerank", msgspec.json.Decoder(RerankRequest), checked_rerank)
