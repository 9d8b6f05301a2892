"""OpenAI Embeddings (`POST /v1/embeddings`): request and response structs.

`input` may be a string, a list of strings, a list of token ids or a list of such lists; msgspec
cannot tell list types apart in a union, so its shape is checked in `router.openai.pooling_checks`.
vLLM's extensions are accepted as vLLM's server accepts them: `truncate_prompt_tokens` (keep the
last so many tokens of each input; -1: as many as the model takes) and `use_activation` (false:
the vectors as pooled, not scaled to unit length), and `normalize`, its older name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from router.openai.common import INT32_MAX

# vLLM's meaning: keep the last so many tokens; -1 keeps as many as the model takes.
TruncatePromptTokens = Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)]


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    """`POST /v1/embeddings` body."""

    model: Annotated[str, msgspec.Meta(min_length=1)]
    input: str | list[Any]
    # "float" or "base64" (`router.openai.pooling_checks.check_encoding_format` says so if not).
    encoding_format: str = "float"
    dimensions: Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)] | None = None
    # An end user's id, for the operator's own records; it changes nothing here.
    user: str | None = None
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    use_activation: bool | None = None
    normalize: bool | None = None

    @property
    def scaled_to_unit_length(self) -> bool:
        """Whether each vector is scaled to unit length (the default, as OpenAI's are)."""
        for choice in (self.use_activation, self.normalize):
            if choice is not None:
                return choice
        return True


class Embedding(msgspec.Struct, kw_only=True):
    """One input's vector: floats, or the base64 of its little-endian float32 bytes."""

    index: int
    embedding: list[float] | str
    object: Literal["embedding"] = "embedding"


class EmbeddingUsage(msgspec.Struct, kw_only=True):
    """Tokens the inputs held (an embedding has no completion)."""

    prompt_tokens: int
    total_tokens: int


class EmbeddingList(msgspec.Struct, kw_only=True):
    """The response: one `Embedding` per input, in input order."""

    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
    object: Literal["list"] = "list"
