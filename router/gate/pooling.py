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
    check_classification_request,
    check_embedding_request,
    check_rerank_request,
)
from router.openai.rerank import RerankRequest
from switchboard.config import FrontDoorConfig


def checked_embeddings(body: EmbeddingRequest, bounds: FrontDoorConfig) -> EmbeddingsAsk:
    return EmbeddingsAsk(body, check_embedding_request(body, bounds))


def checked_classification(body: ClassificationRequest, bounds: FrontDoorConfig) -> ClassificationAsk:
    return ClassificationAsk(body, check_classification_request(body, bounds))


def checked_rerank(body: RerankRequest, bounds: FrontDoorConfig) -> RerankAsk:
    return RerankAsk(body, check_rerank_request(body, bounds))


EMBEDDINGS = Gate("embeddings", msgspec.json.Decoder(EmbeddingRequest), checked_embeddings)
CLASSIFY = Gate("classification", msgspec.json.Decoder(ClassificationRequest), checked_classification)
RERANK = Gate("rerank", msgspec.json.Decoder(RerankRequest), checked_rerank)
