"""OpenAI Chat Completions: request, response and stream chunk structs.

Constraints are msgspec's own (`Meta`), so a bad value fails in the decoder and comes out as a 400
naming the field. Unknown fields are accepted and ignored, as OpenAI does.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from router.openai.common import Probability, StopSequences, Temperature, TokenCount, Usage


class TextPart(msgspec.Struct, kw_only=True):
    """A text part of a message's content given as a list."""

    type: Literal["text"]
    text: str


class ChatMessageIn(msgspec.Struct, kw_only=True):
    """One message of the conversation as the client sends it."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """The content flattened to one string."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(msgspec.Struct, kw_only=True):
    """Options that only apply when `stream` is true."""

    include_usage: bool = False


class ChatCompletionRequest(msgspec.Struct, kw_only=True):
    """`POST /v1/chat/completions` body."""

    model: Annotated[str, msgspec.Meta(min_length=1)]
    messages: Annotated[list[ChatMessageIn], msgspec.Meta(min_length=1)]
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    seed: int | None = None
    stop: StopSequences = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Only one choice per request for now; more is refused rather than silently ignored.
    n: Annotated[int, msgspec.Meta(ge=1, le=1)] = 1
    user: str | None = None


class ChatMessageOut(msgspec.Struct, kw_only=True):
    """The assistant's message in a non-streamed response."""

    role: Literal["assistant"] = "assistant"
    content: str = ""


class ChatChoice(msgspec.Struct, kw_only=True):
    """One choice of a non-streamed response."""

    index: int
    message: ChatMessageOut
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(msgspec.Struct, kw_only=True):
    """A whole chat completion (`stream: false`)."""

    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: Literal["chat.completion"] = "chat.completion"


class ChatDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a stream chunk adds to the assistant's message."""

    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(msgspec.Struct, kw_only=True):
    """One choice of a stream chunk."""

    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    """One server-sent event of a streamed chat completion."""

    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    # Present (null until the final usage chunk) only when stream_options.include_usage is set.
    usage: Usage | msgspec.UnsetType | None = msgspec.UNSET
