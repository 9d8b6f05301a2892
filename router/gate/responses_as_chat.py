"""A Responses request (`/v1/responses`) as the chat request that answers it, checked on the way.

`instructions` become the first (system) message and `input` the rest: a string is one user
message; a list's messages keep their roles, a `function_call` item becomes an assistant message's
tool call (calls in a row join one message, as a model that calls in parallel wrote them) and a
`function_call_output` item a `tool` message. `text.format` becomes `response_format`,
`max_output_tokens` the completion's length, function tools the chat's tools. What needs a stored
response (`previous_response_id`, `conversation`, `item_reference` items) or a hosted tool is a
400 that says what to send instead; reasoning items a client sends back are left out (the models
served here write none).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from router.openai.chat import (
    MAX_TOOL_CALLS_PER_MESSAGE,
    SERVICE_TIERS,
    ChatCompletionRequest,
    ChatMessageIn,
    ContentPart,
    FunctionCallIn,
    FunctionDefinition,
    ImageUrl,
    JsonObjectFormat,
    JsonSchemaFormat,
    JsonSchemaSpec,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    TextFormat,
    Tool,
    ToolCallIn,
)
from router.openai.chat import ToolChoice as ChatToolChoice
from router.openai.checks import TEXT_AND_IMAGES, check_chat, invalid, unsupported
from router.openai.common import UNSET
from router.openai.errors import InvalidRequestError
from router.openai.responses import (
    FunctionTool,
    InputItem,
    InputPart,
    ItemContent,
    ResponsesRequest,
    ToolChoice,
)

# `include` asks for parts of the answer: log probabilities are served; the rest name outputs of
# hosted tools and reasoning, which the models served here never produce (asking changes nothing).
INCLUDE_LOGPROBS = "message.output_text.logprobs"
NEVER_PRODUCED = frozenset(
    {
        "reasoning.encrypted_content",
        "code_interpreter_call.outputs",
        "computer_call_output.output.image_url",
        "file_search_call.results",
        "message.input_image.image_url",
        "web_search_call.action.sources",
        "web_search_call.results",
    }
)
NOT_STORED = "responses are not stored here; send the whole conversation in `input`"
# The chat request's fields that errors found later (the context's length, the chat template) name,
# as a Responses request calls them.
_CHAT_TERMS = (
    ("response_format.json_schema.schema", "text.format.schema"),
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),
    ("messages", "input"),
    ("response_format", "text.format"),
)
_TEXT_PARTS = ("input_text", "output_text", "text")


def chat_request(request: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request that answers `request` (400s for what cannot be served)."""
    _check_unsupported(request)
    chat = ChatCompletionRequest(
        model=request.model,
        service_tier=request.service_tier,  # type: ignore[arg-type]  # checked in `check_responses`
        messages=_messages(request),
        max_completion_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        stream=request.stream,
        logprobs=wants_logprobs(request),
        top_logprobs=request.top_logprobs if wants_logprobs(request) else None,
        response_format=_response_format(request),
        tools=[_tool(position, tool) for position, tool in enumerate(request.tools or ())] or None,
        tool_choice=_tool_choice(request.tool_choice),
        parallel_tool_calls=request.parallel_tool_calls,
        metadata=request.metadata,
        user=request.user,
        seed=request.seed,
        stop=request.stop,
        top_k=request.top_k,
        min_p=request.min_p,
        repetition_penalty=request.repetition_penalty,
        structured_outputs=request.structured_outputs,
    )
    check_chat(chat)
    return chat


def wants_logprobs(request: ResponsesRequest) -> bool:
    return INCLUDE_LOGPROBS in (request.include or ())


def _check_unsupported(request: ResponsesRequest) -> None:
    for field in ("previous_response_id", "conversation"):
        if getattr(request, field) not in (UNSET, None):
            raise unsupported(field, NOT_STORED)
    if request.background not in (UNSET, None, False):
        raise unsupported("background", "responses are answered while the request waits, or streamed")
    if request.prompt not in (UNSET, None):
        raise unsupported("prompt", "reusable prompts are not stored here; send `instructions` and `input`")
    if _asks_for_reasoning(request.reasoning):
        raise unsupported("reasoning", "the models served here take no reasoning settings")
    if request.truncation == "auto":
        raise unsupported(
            "truncation", "a conversation longer than the model's context is a 400; shorten `input`"
        )
    if request.service_tier not in (None, *SERVICE_TIERS):
        raise invalid("service_tier", f"`service_tier` is one of {', '.join(SERVICE_TIERS)}.")
    if request.text is not None and request.text.verbosity not in (UNSET, None, "medium"):
        raise unsupported("text.verbosity", "the models served here take no verbosity setting")
    for position, entry in enumerate(request.include or ()):
        if entry != INCLUDE_LOGPROBS and entry not in NEVER_PRODUCED:
            raise invalid(f"include[{position}]", f"Unknown `include` value `{entry}`.")


def _asks_for_reasoning(reasoning: Any) -> bool:
    if reasoning in (UNSET, None):
        return False
    return not isinstance(reasoning, dict) or any(value is not None for value in reasoning.values())


# --- input ----------------------------------------------------------------------------------------


def _messages(request: ResponsesRequest) -> list[ChatMessageIn]:
    messages: list[ChatMessageIn] = []
    if request.instructions:
        messages.append(ChatMessageIn(role="system", content=request.instructions))
    if isinstance(request.input, str):
        messages.append(ChatMessageIn(role="user", content=request.input))
        return messages
    for position, item in enumerate(request.input):
        _add_item(messages, f"input[{position}]", item)
    if not any(message.role != "system" for message in messages):
        raise invalid("input", "`input` holds no message; give at least one.")
    return messages


def _add_item(messages: list[ChatMessageIn], param: str, item: InputItem) -> None:
    if item.type == "message":
        if item.role is None:
            raise invalid(f"{param}.role", "A message item needs a `role`.")
        if item.content is None:
            raise invalid(f"{param}.content", "A message item needs `content`.")
        messages.append(ChatMessageIn(role=item.role, content=_text(f"{param}.content", item.content)))
    elif item.type == "function_call":
        call = ToolCallIn(
            id=_required(item.call_id, f"{param}.call_id"),
            function=FunctionCallIn(
                name=_required(item.name, f"{param}.name"),
                arguments=_required(item.arguments, f"{param}.arguments"),
            ),
        )
        last = messages[-1] if messages else None
        if last is not None and last.role == "assistant" and last.tool_calls is not None:
            if len(last.tool_calls) == MAX_TOOL_CALLS_PER_MESSAGE:
                raise invalid(
                    param,
                    f"At most {MAX_TOOL_CALLS_PER_MESSAGE} `function_call` items in a row are taken (they "
                    "are one turn of the model's); this is one more.",
                )
            last.tool_calls.append(call)
        elif last is not None and last.role == "assistant":  # its text, then its calls
            last.tool_calls = [call]
        else:
            messages.append(ChatMessageIn(role="assistant", content=None, tool_calls=[call]))
    elif item.type == "function_call_output":
        output = _required(item.output, f"{param}.output")
        call_id = _required(item.call_id, f"{param}.call_id")
        messages.append(
            ChatMessageIn(role="tool", content=_text(f"{param}.output", output), tool_call_id=call_id)
        )
    elif item.type == "item_reference":
        raise unsupported(f"{param}.type", NOT_STORED)
    elif item.type != "reasoning":
        raise invalid(
            f"{param}.type",
            f"Input items of type `{item.type}` are not served here; send `message`, `function_call` "
            "and `function_call_output` items.",
        )


def _text(param: str, content: ItemContent) -> str | list[ContentPart]:
    if isinstance(content, str):
        return content
    parts = []
    for index, part in enumerate(content):
        if part.type in _TEXT_PARTS and part.text is not None:
            parts.append(ContentPart(type="text", text=part.text))
        elif part.type == "refusal" and part.refusal is not None:
            parts.append(ContentPart(type="refusal", refusal=part.refusal))
        elif part.type == "input_image":
            parts.append(_image_part(f"{param}[{index}]", part))
        elif part.type in ("input_file", "input_audio"):
            raise InvalidRequestError(
                f"Content parts of type `{part.type}` are not supported: {TEXT_AND_IMAGES}. Send "
                "`input_text` and `input_image` parts.",
                param=f"{param}[{index}].type",
                code="unsupported_content",
            )
        else:
            raise invalid(
                f"{param}[{index}].type",
                f"Unknown content part type `{part.type}`; use `input_text` or `input_image`.",
            )
    return parts


def _image_part(param: str, part: InputPart) -> ContentPart:
    """An `input_image` part as chat's `image_url` part."""
    if part.image_url is None:
        if part.file_id is not None:
            raise unsupported(
                f"{param}.file_id", "no files are stored here; send the image as `image_url` (a data URL)"
            )
        raise invalid(f"{param}.image_url", "An input_image part needs `image_url`.")
    return ContentPart(type="image_url", image_url=ImageUrl(url=part.image_url, detail=part.detail))


def _required(value: Any, param: str) -> Any:
    if value is None:
        field = param.rsplit(".", 1)[-1]
        raise invalid(param, f"This item needs `{field}`.")
    return value


# --- tools and formats ----------------------------------------------------------------------------


def _tool(position: int, tool: FunctionTool) -> Tool:
    if tool.type != "function":
        raise unsupported(
            f"tools[{position}].type", f"hosted tools (`{tool.type}`) are not available; give functions"
        )
    if tool.name is None:
        raise invalid(f"tools[{position}].name", "A function tool needs a `name`.")
    definition = FunctionDefinition(
        name=tool.name, description=tool.description, parameters=tool.parameters, strict=tool.strict
    )
    return Tool(type="function", function=definition)


def _tool_choice(choice: ToolChoice | None) -> ChatToolChoice | None:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.type != "function":
        raise unsupported("tool_choice", f"`{choice.type}` choices are not available; name a function")
    if choice.name is None:
        raise invalid("tool_choice.name", "A function choice needs the function's `name`.")
    return NamedToolChoice(type="function", function=NamedFunction(name=choice.name))


def _response_format(request: ResponsesRequest) -> ResponseFormat | None:
    spec = request.text.format if request.text is not None else None
    if spec is None or spec.type == "text":
        return None if spec is None else TextFormat()
    if spec.type == "json_object":
        return JsonObjectFormat()
    if spec.name is None:
        raise invalid("text.format.name", "A `json_schema` format needs a `name`.")
    if spec.schema is None:
        raise invalid("text.format.schema", "A `json_schema` format needs its `schema`.")
    return JsonSchemaFormat(
        json_schema=JsonSchemaSpec(
            name=spec.name, schema=spec.schema, description=spec.description, strict=spec.strict
        )
    )


@contextmanager
def in_responses_words(responses: bool) -> Iterator[None]:
    """Errors raised within, found on the chat request that answers a Responses request (when
    `responses`), name the Responses request's fields (`in_responses_terms`)."""
    try:
        yield
    except InvalidRequestError as error:
        translated = in_responses_terms(error) if responses else error
        if translated is error:
            raise
        raise translated from error


def in_responses_terms(error: InvalidRequestError) -> InvalidRequestError:
    """`error`, found on the chat request that answers a Responses request, in the Responses
    request's words (`max_tokens` is `max_output_tokens`, `messages` is `input`)."""
    message, param = error.message, error.param
    for chat, responses in _CHAT_TERMS:
        message = message.replace(chat, responses)
        if param is not None and (param == chat or param.startswith((f"{chat}[", f"{chat}."))):
            param = responses + param[len(chat) :]
    # A chat tool is `{"type", "function": {name, parameters}}`; a Responses tool is flat.
    if param is not None and param.startswith("tools[") and ".function." in param:
        param = param.replace(".function.", ".", 1)
    if (message, param) == (error.message, error.param):
        return error
    return InvalidRequestError(message, param=param, code=error.code, headers=error.headers)
