"""Field types and structs shared by the OpenAI endpoints."""

from __future__ import annotations

from typing import Annotated

import msgspec

TokenCount = Annotated[int, msgspec.Meta(ge=1)]
Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]
Probability = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
# OpenAI accepts one stop string or a list of up to four.
StopSequences = str | Annotated[list[str], msgspec.Meta(max_length=4)] | None


class Usage(msgspec.Struct, kw_only=True):
    """Token counts of a completion."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


def stop_list(stop: StopSequences) -> tuple[str, ...]:
    """`stop` as a tuple of non-empty strings."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    return tuple(s for s in stop if s)
