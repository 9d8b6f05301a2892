"""OpenAI Chat Completions: request, response and stream chunk structs.

Constraints are msgspec's own (`Meta`), so a bad value fails in the decoder and comes out as a 400
naming the field; what one field cannot say alone (a parameter that needs another, content parts,
tool choices) is checked in `router.openai.checks`. Unknown fields are accepted and ignored, as
vLLM's server does; fields OpenAI defines that are not supported here are refused by name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from router.openai.common import UNSET, CompletionUsage, SamplingRequest, TokenCount

Role = Literal["system", "developer", "user", "assistant", "tool"]
FunctionName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
# OpenAI's limits: a participant's or a called function's name is at most 64 characters, and an
# assistant message carries at most 128 tool calls.
Name = Annotated[str, msgspec.Meta(max_length=64)]
MAX_TOOL_CALLS_PER_MESSAGE = 128
# A tool call's id is an opaque token (OpenAI's are about 30 characters).
ToolCallId = Annotated[str, msgspec.Meta(max_length=256)]
# Parts of one message: its text parts are joined into one text before the chat template sees
# them, and its images are put in the job (how many a request sends is a bound of the front door's).
MAX_CONTENT_PARTS = 256


# What a request may ask for as its `service_tier` (OpenAI's, less "scale"): see `wire.TIERS`.
ServiceTier = Literal["auto", "default", "flex", "priority"]
SERVICE_TIERS: tuple[ServiceTier, ...] = ("auto", "default", "flex", "priority")


class ImageUrl(msgspec.Struct, kw_only=True):
    """An image part's image: a `data:image/...;base64,` URL, or an `http(s)` URL the front door
    fetches where the operator allows it (`router.image_urls`)."""

    url: Annotated[str, msgspec.Meta(min_length=1)]
    # OpenAI's resolution hint; the model's own processor decides here, whatever it says.
    detail: Literal["auto", "low", "high"] | None = None


class ContentPart(msgspec.Struct, kw_only=True):
    """One part of a message's content given as a list: text, an earlier refusal, or an image."""

    type: str
    text: str | None = None
    refusal: str | None = None
    # An `image_url` part's image (some clients send the URL alone, as vLLM's server takes it).
    image_url: ImageUrl | str | None = None

    @property
    def image(self) -> ImageUrl | None:
        """The image of an `image_url` part, whichever way it was written."""
        if isinstance(self.image_url, str):
            return ImageUrl(url=self.image_url)
        return self.image_url


class FunctionCallIn(msgspec.Struct, kw_only=True):
    """The function an assistant message called: its name and its arguments as JSON text."""

    name: Name
    arguments: str


class ToolCallIn(msgspec.Struct, kw_only=True):
    """An earlier tool call of the assistant, in the conversation sent back."""

    id: ToolCallId
    function: FunctionCallIn
    type: Literal["function"] = "function"


class ChatMessageIn(msgspec.Struct, kw_only=True):
    """One message of the conversation as the client sends it."""

    role: Role
    content: str | Annotated[list[ContentPart], msgspec.Meta(max_length=MAX_CONTENT_PARTS)] | None = None
    name: Name | None = None
    tool_calls: Annotated[list[ToolCallIn], msgspec.Meta(max_length=MAX_TOOL_CALLS_PER_MESSAGE)] | None = None
    tool_call_id: ToolCallId | None = None

    def text(self) -> str:
        """The content flattened to one string (a list's text and refusal parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or part.refusal or "" for part in self.content)


class FunctionDefinition(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A function the model may call."""

    name: FunctionName
    description: str | None = None
    # A JSON Schema object for the arguments; none means a function without arguments.
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(msgspec.Struct, kw_only=True):
    """One entry of `tools`."""

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(msgspec.Struct, kw_only=True):
    name: str


class NamedToolChoice(msgspec.Struct, kw_only=True):
    """`tool_choice` naming the one function the model must call."""

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class TextFormat(msgspec.Struct, kw_only=True, tag="text", tag_field="type"):
    """Plain text, the default."""


class JsonObjectFormat(msgspec.Struct, kw_only=True, tag="json_object", tag_field="type"):
    """Any JSON object."""


class JsonSchemaSpec(msgspec.Struct, kw_only=True):
    """A named JSON Schema the answer must satisfy."""

    name: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    # `schema` is the field's name in OpenAI's API.
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class JsonSchemaFormat(msgspec.Struct, kw_only=True, tag="json_schema", tag_field="type"):
    """JSON that a schema accepts."""

    json_schema: JsonSchemaSpec


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaFormat


class ChatCompletionRequest(SamplingRequest, kw_only=True):
    """`POST /v1/chat/completions` body."""

    messages: Annotated[list[ChatMessageIn], msgspec.Meta(min_length=1)]
    max_completion_tokens: TokenCount | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], msgspec.Meta(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # Identifiers for the operator's records and OpenAI's caches; they change nothing here.
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # Defined by OpenAI, not supported here: refused when given a value that would change anything.
    audio: Any = UNSET
    modalities: Any = UNSET
    prediction: Any = UNSET
    web_search_options: Any = UNSET
    functions: Any = UNSET
    function_call: Any = UNSET
    store: Any = UNSET
    reasoning_effort: Any = UNSET
    verbosity: Any = UNSET
    # Which line the request waits in among its model's jobs: flex behind default, priority ahead
    # (a key may use priority only where its `service_tiers` allow it); auto is default.
    service_tier: ServiceTier | None = None


class FunctionCallOut(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A function call in a response (in a stream, its name comes once and its arguments in parts)."""

    name: str | None = None
    arguments: str = ""


class ToolCallOut(msgspec.Struct, kw_only=True):
    """A tool call of a non-streamed response."""

    id: str
    function: FunctionCallOut
    type: Literal["function"] = "function"


class ToolCallDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A piece of a tool call in a stream chunk: the first carries its id, type and name."""

    index: int
    function: FunctionCallOut
    id: str | None = None
    type: Literal["function"] | None = None


class TopLogprobOut(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobOut(msgspec.Struct, kw_only=True):
    """One generated token's log probability and its most likely alternatives."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprobOut]


class ChoiceLogprobs(msgspec.Struct, kw_only=True):
    content: list[TokenLogprobOut] | None
    refusal: None = None


class ChatMessageOut(msgspec.Struct, kw_only=True):
    """The assistant's message in a non-streamed response."""

    role: Literal["assistant"] = "assistant"
    content: str | None = ""
    tool_calls: list[ToolCallOut] | msgspec.UnsetType = msgspec.UNSET
    refusal: None = None


class ChatChoice(msgspec.Struct, kw_only=True):
    """One choice of a non-streamed response."""

    index: int
    message: ChatMessageOut
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(msgspec.Struct, kw_only=True):
    """A whole chat completion (`stream: false`)."""

    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: CompletionUsage
    object: Literal["chat.completion"] = "chat.completion"
    # The tier it was served in (`wire.TIERS`; "batch" for a Batch API line).
    service_tier: str = "default"


class ChatDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a stream chunk adds to the assistant's message."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(msgspec.Struct, kw_only=True):
    """One choice of a stream chunk."""

    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    """One server-sent event of a streamed chat completion."""

    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    service_tier: str = "default"
    # Present (null until the final usage chunk) only when stream_options.include_usage is set.
    usage: CompletionUsage | msgspec.UnsetType | None = msgspec.UNSET
