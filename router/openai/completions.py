"""OpenAI (legacy) Completions: request, response and stream chunk structs.

`prompt` may be a string, a list of strings, a list of token ids or a list of such lists; msgspec
cannot tell list types apart in a union, so its shape is checked in `router.openai.checks`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from router.openai.common import CompletionUsage, SamplingRequest, TokenCount

# OpenAI's default for this endpoint, which vLLM follows; an explicit null generates to the end of
# the context, as vLLM's server does (chat has no such default: it generates to the end).
COMPLETION_MAX_TOKENS_DEFAULT = 16


class CompletionRequest(SamplingRequest, kw_only=True):
    """`POST /v1/completions` body."""

    prompt: str | list[Any]
    max_tokens: TokenCount | None = COMPLETION_MAX_TOKENS_DEFAULT
    echo: bool = False
    # OpenAI allows up to 5 alternatives per position here.
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=5)] | None = None
    suffix: str | None = None
    best_of: Annotated[int, msgspec.Meta(ge=1, le=20)] | None = None


class CompletionLogprobs(msgspec.Struct, kw_only=True):
    """Log probabilities of a choice, in the completions API's column layout."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(msgspec.Struct, kw_only=True):
    """One choice of a completion, or of one of its stream chunks."""

    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class Completion(msgspec.Struct, kw_only=True):
    """A whole completion, or one server-sent event of a streamed one (the same object in OpenAI's API)."""

    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    object: Literal["text_completion"] = "text_completion"
    usage: CompletionUsage | msgspec.UnsetType | None = msgspec.UNSET
