"""OpenAI Models endpoint structs (`GET /v1/models`)."""

from __future__ import annotations

from typing import Literal

import msgspec

from switchboard.config import ModelKind


class ModelCard(msgspec.Struct, kw_only=True):
    """One model as OpenAI lists it."""

    id: str
    created: int
    owned_by: str = "switchboard"
    object: Literal["model"] = "model"
    # Switchboard's own, which OpenAI's clients ignore: what the model answers (routes and
    # pipelines serve text generation); see `router.openai.pooling_checks.KIND_ENDPOINTS`.
    kind: ModelKind = "generate"
    # A LoRA adapter's base model, as vLLM lists it (None for a whole model).
    parent: str | None = None
    # What the model reads: ["text"], or ["text", "image"] for a model that takes image parts.
    input_modalities: list[str] = msgspec.field(default_factory=lambda: ["text"])


class ModelList(msgspec.Struct, kw_only=True):
    """The list of models served."""

    data: list[ModelCard]
    object: Literal["list"] = "list"
