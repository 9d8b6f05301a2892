"""OpenAI Responses (`POST /v1/responses`): the request, the response object and its stream events.

A response is answered by the same chat job as a chat completion (`router.gate.responses_as_chat` turns
one into the other); only the shapes differ. Nothing is stored: a request carries its whole
conversation in `input`, as it does with `store: false` at OpenAI. Items and content parts are
decoded loosely (a `type` and the fields any type may have) so that an item or part of a type not
served here is a 400 that names it, not a decoder's complaint about a tag.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from router.openai.chat import FunctionName, Name, TokenLogprobOut, ToolCallId
from router.openai.common import (
    UNSET,
    Probability,
    RepetitionPenalty,
    Seed,
    StopSequences,
    StructuredOutputs,
    Temperature,
    TokenCount,
    TopK,
)

# Items of one request's `input`, and content parts of one item: each becomes part of a chat message.
MAX_INPUT_ITEMS = 2048
MAX_ITEM_PARTS = 256


class InputPart(msgspec.Struct, kw_only=True):
    """One content part of an input item (`input_text`, an image as `input_image`, or an earlier
    answer's `output_text`)."""

    type: str
    text: str | None = None
    refusal: str | None = None
    # `input_image`: its image as a data URL or an `http(s)` URL (as chat's `image_url.url`), or an
    # uploaded file's id (no files are stored here: refused), and OpenAI's resolution hint.
    image_url: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    file_id: str | None = None
    detail: Literal["auto", "low", "high"] | None = None


ItemContent = str | Annotated[list[InputPart], msgspec.Meta(max_length=MAX_ITEM_PARTS)]


class InputItem(msgspec.Struct, kw_only=True):
    """One item of `input`: a message (its `type` may be left out), an earlier function call of the
    model, or the output a function call gave; the fields of every type, checked per type."""

    type: str = "message"
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: ItemContent | None = None
    call_id: ToolCallId | None = None
    name: Name | None = None
    arguments: str | None = None
    output: ItemContent | None = None
    id: str | None = None
    status: str | None = None


class FunctionTool(msgspec.Struct, kw_only=True):
    """One entry of `tools` (only functions are served; any other `type` is a 400 naming it)."""

    type: str
    name: FunctionName | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(msgspec.Struct, kw_only=True):
    """`tool_choice` naming the one function the model must call (or a hosted tool: refused)."""

    type: str
    name: str | None = None


ToolChoice = Literal["none", "auto", "required"] | FunctionToolChoice


class TextFormatSpec(msgspec.Struct, kw_only=True, omit_defaults=True):
    """`text.format`: plain text, any JSON object, or JSON a named schema accepts."""

    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")] | None = None
    # `schema` is the field's name in OpenAI's API.
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextOptions(msgspec.Struct, kw_only=True, omit_defaults=True):
    format: TextFormatSpec | None = None
    verbosity: Any = UNSET


class ResponsesRequest(msgspec.Struct, kw_only=True):
    """`POST /v1/responses` body."""

    model: Annotated[str, msgspec.Meta(min_length=1)]
    input: str | Annotated[list[InputItem], msgspec.Meta(min_length=1, max_length=MAX_INPUT_ITEMS)]
    instructions: str | None = None
    max_output_tokens: TokenCount | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    tools: Annotated[list[FunctionTool], msgspec.Meta(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: Annotated[int, msgspec.Meta(ge=1)] | None = None
    text: TextOptions | None = None
    stream: bool = False
    # Not stored here, whatever this says: a response names `store: false`.
    store: bool | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    # Identifiers for the operator's records and OpenAI's caches; they change nothing here.
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    # The chat's sampling extensions (vLLM's server takes them on chat too), sent as `extra_body`.
    seed: Seed | None = None
    stop: StopSequences = None
    top_k: TopK | None = None
    min_p: Probability | None = None
    repetition_penalty: RepetitionPenalty | None = None
    structured_outputs: StructuredOutputs | None = None
    # Defined by OpenAI, not served here: refused when given a value that would change anything.
    previous_response_id: Any = UNSET
    conversation: Any = UNSET
    background: Any = UNSET
    prompt: Any = UNSET
    reasoning: Any = UNSET
    stream_options: Any = UNSET


# --- the response ---------------------------------------------------------------------------------


class OutputText(msgspec.Struct, kw_only=True, tag="output_text", tag_field="type"):
    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    # Each token's as on chat (`message.output_text.logprobs` in `include`).
    logprobs: list[TokenLogprobOut] = msgspec.field(default_factory=list)


class OutputMessage(msgspec.Struct, kw_only=True, tag="message", tag_field="type"):
    """The assistant's text."""

    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]
    role: Literal["assistant"] = "assistant"


class OutputFunctionCall(msgspec.Struct, kw_only=True, tag="function_call", tag_field="type"):
    """A call of one of the request's functions: its output goes back as a `function_call_output`
    item with the same `call_id`."""

    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


OutputItem = OutputMessage | OutputFunctionCall


class InputTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int = 0


class OutputTokensDetails(msgspec.Struct, kw_only=True):
    reasoning_tokens: int = 0


class ResponseUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails = msgspec.field(default_factory=InputTokensDetails)
    output_tokens_details: OutputTokensDetails = msgspec.field(default_factory=OutputTokensDetails)


class IncompleteDetails(msgspec.Struct, kw_only=True):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseError(msgspec.Struct, kw_only=True):
    code: str
    message: str


class ResponseObject(msgspec.Struct, kw_only=True):
    """A response, whole (`stream: false`) or as a stream's `response.*` events carry it."""

    id: str
    created_at: int
    model: str
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    output: list[OutputItem]
    usage: ResponseUsage | None = None
    incomplete_details: IncompleteDetails | None = None
    error: ResponseError | None = None
    # What the request asked, echoed as OpenAI's responses echo it.
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[FunctionTool] = msgspec.field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    text: TextOptions | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    user: str | None = None
    truncation: str = "disabled"
    previous_response_id: None = None
    reasoning: None = None
    store: bool = False
    background: bool = False
    # The tier it was served in (`wire.TIERS`).
    service_tier: str = "default"
    object: Literal["response"] = "response"


class StreamEvent(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One event of a streamed response: `type` says which (`response.output_text.delta`, ...),
    `sequence_number` counts them from 0, and the rest is the fields of that type."""

    type: str
    sequence_number: int
    response: ResponseObject | None = None
    output_index: int | None = None
    item_id: str | None = None
    content_index: int | None = None
    item: OutputItem | None = None
    part: OutputText | None = None
    delta: str | None = None
    text: str | None = None
    arguments: str | None = None
    name: str | None = None
    logprobs: list[TokenLogprobOut] | None = None
