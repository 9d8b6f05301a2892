"""vLLM's classification API (`POST /classify`, `/v1/classify`): request and response structs.

Read from vLLM 0.32's `entrypoints/pooling/classify/protocol.py`: `input` as for embeddings, each
answered with its label (the most probable), the probability of every label and how many there are.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from router.openai.embeddings import TruncatePromptTokens


class ClassificationRequest(msgspec.Struct, kw_only=True):
    """`POST /classify` body."""

    model: Annotated[str, msgspec.Meta(min_length=1)]
    input: str | list[Any]
    user: str | None = None
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    # vLLM's: false asks for raw logits, which the workers do not return (refused by name).
    use_activation: bool | None = None


class Classification(msgspec.Struct, kw_only=True):
    """One input's class: its most probable label, and each label's probability in label order."""

    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class PoolingUsage(msgspec.Struct, kw_only=True):
    """vLLM's usage object for the pooling endpoints: a completion of nothing."""

    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class ClassificationList(msgspec.Struct, kw_only=True):
    """The response: one `Classification` per input, in input order."""

    id: str
    created: int
    model: str
    data: list[Classification]
    usage: PoolingUsage
    object: Literal["list"] = "list"
