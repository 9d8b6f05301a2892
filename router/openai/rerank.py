"""The rerank API (`POST /rerank`, `/v1/rerank`, `/v2/rerank`): request and response structs.

The shape vLLM's server answers (vLLM 0.32's `entrypoints/pooling/scoring/protocol.py`), which
Jina's and Cohere's clients read: a `query`, its `documents` (strings, or objects with `text` as
Jina's and Cohere's APIs take them), `top_n` (0: all); results sorted by `relevance_score`, each
naming its document's `index` in the request and, unless `return_documents` is false, its text.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from router.openai.embeddings import TruncatePromptTokens


class RerankRequest(msgspec.Struct, kw_only=True):
    """`POST /rerank` body."""

    model: Annotated[str, msgspec.Meta(min_length=1)]
    query: str
    # Strings or `{"text": ...}` objects; a single string is one document (as vLLM takes it).
    documents: str | list[Any]
    top_n: Annotated[int, msgspec.Meta(ge=0)] = 0
    return_documents: bool = True
    user: str | None = None
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    # vLLM's: false asks for raw logits, which the workers do not return (refused by name).
    use_activation: bool | None = None


class RerankDocument(msgspec.Struct, kw_only=True):
    """A document as the client sent it."""

    text: str


class RerankResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One document's relevance to the query, and where it was in the request."""

    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankUsage(msgspec.Struct, kw_only=True):
    """Tokens the engine read: the query once per document, and the documents."""

    prompt_tokens: int
    total_tokens: int


class RerankResponse(msgspec.Struct, kw_only=True):
    """The response: the documents' results, most relevant first, at most `top_n` of them."""

    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]
