"""OpenAI Models endpoint structs (`GET /v1/models`)."""

from __future__ import annotations

from typing import Literal

import msgspec


class ModelCard(msgspec.Struct, kw_only=True):
    """One model as OpenAI lists it."""

    id: str
    created: int
    owned_by: str = "switchboard"
    object: Literal["model"] = "model"


class ModelList(msgspec.Struct, kw_only=True):
    """The list of models served."""

    data: list[ModelCard]
    object: Literal["list"] = "list"
