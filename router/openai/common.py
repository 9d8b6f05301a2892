"""Field types and structs shared by the OpenAI endpoints (chat and plain completions).

Bounds are those of OpenAI's published specification, written as msgspec constraints so that a bad
value fails in the decoder and comes out as a 400 naming the field. vLLM's own extensions (top_k,
min_p, repetition_penalty, min_tokens, structured_outputs) are accepted too, as vLLM's server accepts them.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

# Token counts and token ids cross Redis as msgpack integers and reach engines that hold them in 32
# bits; larger ones would fail there (or in the job's encoding) instead of as a 400 naming the field.
INT32_MAX = 2**31 - 1
TokenCount = Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)]
Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]
Probability = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]
# OpenAI documents seeds as 64-bit integers; larger ones cannot reach an engine.
Seed = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
# OpenAI accepts one stop string or a list of up to four. Each is matched against the tail of every
# choice's text at every step, and a stream holds back as many characters as the longest may span:
# real stop strings are a few characters, and none is taken past STOP_CHARS.
STOP_CHARS = 1024
StopString = Annotated[str, msgspec.Meta(max_length=STOP_CHARS)]
StopSequences = StopString | Annotated[list[StopString], msgspec.Meta(max_length=4)] | None
# Token ids (as JSON object keys, so strings) to a bias in [-100, 100]; OpenAI takes up to 300.
LogitBias = Annotated[
    dict[str, Annotated[float, msgspec.Meta(ge=-100, le=100)]], msgspec.Meta(max_length=300)
]
# JSON has no -inf: a log probability of a token that cannot occur is sent as this, as OpenAI does.
LOWEST_LOGPROB = -9999.0
# Choices per prompt: OpenAI allows up to 128.
ChoiceCount = Annotated[int, msgspec.Meta(ge=1, le=128)]
# vLLM's extensions' bounds (-1: no top-k cut).
TopK = Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)]
RepetitionPenalty = Annotated[float, msgspec.Meta(gt=0.0, le=2.0)]


class StreamOptions(msgspec.Struct, kw_only=True):
    """Options that only apply when `stream` is true."""

    include_usage: bool = False


class StructuredOutputs(msgspec.Struct, kw_only=True):
    """vLLM's extension: constrain the text to JSON of a schema, a regular expression, one of several
    strings, or an EBNF grammar (exactly one)."""

    json: dict[str, Any] | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: Annotated[list[str], msgspec.Meta(min_length=1)] | None = None
    grammar: str | None = None


# vLLM's rules for a salt (non-empty, no '@', '/', backslash or NUL), at most 95 characters so
# that with the key's salt before it the whole stays within vLLM's 128.
ClientCacheSalt = Annotated[str, msgspec.Meta(min_length=1, max_length=95, pattern=r"^[^@/\\\x00]+$")]


class SamplingRequest(msgspec.Struct, kw_only=True):
    """What every generation request has: the model, how to sample, and how to answer."""

    model: Annotated[str, msgspec.Meta(min_length=1)]
    max_tokens: TokenCount | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    n: ChoiceCount = 1
    seed: Seed | None = None
    stop: StopSequences = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None
    # An end user's id, for the operator's own records; it changes nothing here.
    user: str | None = None
    # vLLM's extensions.
    top_k: TopK | None = None
    min_p: Probability | None = None
    repetition_penalty: RepetitionPenalty | None = None
    min_tokens: Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)] | None = None
    structured_outputs: StructuredOutputs | None = None
    # vLLM's prefix-cache salt: with keys on, only a suffix to the key's own salt, never in its
    # place (`router.intake.job.cache_salt`).
    cache_salt: ClientCacheSalt | None = None


class CompletionUsage(msgspec.Struct, kw_only=True):
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


UNSET: Any = msgspec.UNSET
