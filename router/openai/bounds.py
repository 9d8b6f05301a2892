"""Bounds on how much one request may ask for, checked at the front door before it is queued.

A worker's engine serves many streams at once, so one request that costs it seconds before its first
token (a grammar of thousands of choices, a conversation of a hundred thousand empty messages) stalls
every other stream of that model. Each bound below is far above what a demanding legitimate request
sends, and low enough that no single request costs a worker more than a moment. Past one, the
request is a 400 whose `param` names the parameter and whose message states the bound.

The bounds an operator may need to raise are router settings (`switchboard.config.FrontDoorConfig`:
`max_messages`, `max_tools_bytes`, `max_structured_output_bytes`, `max_structured_output_choices`),
checked here with what no field's type can say (a schema's nesting, an estimate of the rendered
prompt). Bounds that are OpenAI's own published limits are constraints of the request structs, so
that the decoder refuses them: 128 tools, 128 tool calls per message, 64-character names, 4 stop
strings (and 1,024 characters each), 300 `logit_bias` entries, `n` up to 128, 256 content parts per
message (`router.openai.chat`, `router.openai.common`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from router.openai.chat import ChatCompletionRequest, ChatMessageIn, JsonSchemaFormat
from router.openai.common import SamplingRequest
from router.openai.errors import InvalidRequestError
from router.openai.required_calls import CALLS_NESTING, calls_schema
from switchboard.config import FrontDoorConfig

# vLLM's own limit (`vllm.sampling_params.MAX_STRUCTURED_OUTPUT_JSON_NESTING`): objects and arrays
# of a JSON schema may nest at most this deep. Counted here exactly as vLLM counts it, so that the
# schema vLLM would refuse is refused here, with a 400, before it is queued.
MAX_SCHEMA_NESTING = 64
# What a chat template writes around each message besides its text (role markers, separators):
# ChatML's `<|im_start|>user\n` and `<|im_end|>\n` are 28 characters. Used for the estimate of the
# rendered prompt, which may be no larger than the largest body the front door reads.
TEMPLATE_CHARS_PER_MESSAGE = 32
# OpenAI's code for a list past its bound; anything else past a bound is an invalid value.
ARRAY_TOO_LONG = "array_above_max_length"

_json = msgspec.json.Encoder()


def check_sampling_bounds(request: SamplingRequest, bounds: FrontDoorConfig) -> None:
    """The bounds every generation request shares: those of its structured outputs."""
    constraints = request.structured_outputs
    if constraints is None:
        return
    limit = bounds.max_structured_output_bytes
    if constraints.json is not None:
        check_schema(constraints.json, "structured_outputs.json", limit)
    if constraints.regex is not None:
        _check_text_size(constraints.regex, "structured_outputs.regex", limit, "regular expression")
        check_regex(constraints.regex, "structured_outputs.regex")
    if constraints.grammar is not None:
        _check_text_size(constraints.grammar, "structured_outputs.grammar", limit, "grammar")
    if constraints.choice is not None:
        _check_choices(constraints.choice, bounds)


def check_chat_bounds(request: ChatCompletionRequest, bounds: FrontDoorConfig) -> None:
    """Everything a chat request may hold: messages, their parts and tool calls, tools, schemas, and
    an estimate of the prompt the model's chat template renders from them."""
    check_sampling_bounds(request, bounds)
    messages = request.messages
    if len(messages) > bounds.max_messages:
        raise refusal(
            "messages",
            f"At most {bounds.max_messages} messages per request; this one has {len(messages)}.",
            ARRAY_TOO_LONG,
        )
    tools_bytes = _check_tools(request, bounds)
    response_format = request.response_format
    if isinstance(response_format, JsonSchemaFormat) and response_format.json_schema.schema is not None:
        check_schema(
            response_format.json_schema.schema,
            "response_format.json_schema.schema",
            bounds.max_structured_output_bytes,
        )
    rendered = template_chars(messages) + tools_bytes
    if rendered > bounds.max_body_bytes:
        raise refusal(
            "messages",
            f"The conversation would render to about {rendered:,} characters of prompt (its text, "
            f"tool calls and tools, and about {TEMPLATE_CHARS_PER_MESSAGE} characters of template per "
            f"message); at most {bounds.max_body_bytes:,} are taken.",
        )


def template_chars(messages: list[ChatMessageIn]) -> int:
    """An estimate of the characters a chat template renders from `messages` (not counting tools):
    every text it may write, and what it writes around each message."""
    total = TEMPLATE_CHARS_PER_MESSAGE * len(messages)
    for message in messages:
        total += len(message.text()) + len(message.name or "") + len(message.tool_call_id or "")
        for call in message.tool_calls or ():
            total += len(call.id) + len(call.function.name) + len(call.function.arguments)
    return total


def check_schema(schema: Any, param: str, max_bytes: int) -> None:
    """Refuse a JSON schema larger than `max_bytes` as JSON, or nested deeper than vLLM allows."""
    size = len(_json.encode(schema))
    if size > max_bytes:
        raise refusal(param, f"The JSON schema is {size:,} bytes as JSON; at most {max_bytes:,} are taken.")
    if json_nesting(schema) > MAX_SCHEMA_NESTING:
        raise refusal(
            param,
            f"The JSON schema nests objects and arrays more than {MAX_SCHEMA_NESTING} levels deep; "
            f"at most {MAX_SCHEMA_NESTING} are taken.",
        )


def json_nesting(value: Any) -> int:
    """How deep objects and arrays nest in `value` (a scalar: 0; `{}` or `[]`: 1), as vLLM counts."""
    depth, level = 0, [value]
    while level:
        level = [node for node in level if isinstance(node, dict | list)]
        if level:
            depth += 1
            level = [child for node in level for child in (node.values() if isinstance(node, dict) else node)]
    return depth


def check_regex(pattern: str, param: str) -> None:
    """Refuse a regular expression that is invalid in every dialect an engine may read it in.

    Engines read their own dialects (xgrammar's is ECMAScript-like), not Python's `re`, so only what
    no dialect accepts is refused here: a NUL character, and, where no character class (`[...]`)
    makes the reading dialect-dependent, parentheses that do not pair up. Everything else is left to
    the engine, whose own refusal is a 400 as well.
    """
    if "\x00" in pattern:
        raise refusal(param, "The regular expression holds a NUL character.")
    if "[" in pattern:
        return
    depth = 0
    escaped = False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                break
    if depth != 0:
        raise refusal(param, "The regular expression's parentheses do not pair up.")


def refusal(param: str, message: str, code: str = "invalid_value") -> InvalidRequestError:
    """The 400 for a parameter past one of the bounds, or invalid for every engine."""
    return InvalidRequestError(message, param=param, code=code)


def _check_text_size(text: str, param: str, max_bytes: int, what: str) -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise refusal(param, f"The {what} is {size:,} bytes; at most {max_bytes:,} are taken.")


def _check_choices(choices: list[str], bounds: FrontDoorConfig) -> None:
    """The engine compiles the choices into one grammar, whose cost grows faster than their number."""
    param = "structured_outputs.choice"
    limit = bounds.max_structured_output_choices
    if len(choices) > limit:
        raise refusal(
            param, f"At most {limit} choices are taken; this request has {len(choices):,}.", ARRAY_TOO_LONG
        )
    size = sum(len(choice.encode("utf-8", "surrogatepass")) for choice in choices)
    if size > bounds.max_structured_output_bytes:
        raise refusal(
            param,
            f"The choices are {size:,} bytes together; at most {bounds.max_structured_output_bytes:,} are taken.",
        )


def _check_tools(request: ChatCompletionRequest, bounds: FrontDoorConfig) -> int:
    """Refuse tools larger together than `max_tools_bytes`, or one whose schema is past the schema
    bounds (a forced tool call compiles it into a grammar); the tools' size as JSON."""
    total = 0
    for index, tool in enumerate(request.tools or ()):
        parameters = tool.function.parameters
        if parameters is not None:
            check_schema(
                parameters, f"tools[{index}].function.parameters", bounds.max_structured_output_bytes
            )
        total += len(_json.encode(tool))
    if total > bounds.max_tools_bytes:
        raise refusal(
            "tools",
            f"The tools are {total:,} bytes as JSON together; at most {bounds.max_tools_bytes:,} are taken.",
        )
    if request.tools and request.tool_choice == "required":
        check_required_calls(request, bounds)
    return total


def check_required_calls(request: ChatCompletionRequest, bounds: FrontDoorConfig) -> None:
    """`tool_choice: "required"` joins every tool's schema into one (`router.openai.required_calls`),
    which the engine compiles as one grammar: that schema, not each tool's, is what must be within
    the structured-output bounds (eight tools of 32 KB each cost a worker two minutes as one)."""
    schema = calls_schema(request.tools or [], request.parallel_tool_calls)
    size = len(_json.encode(schema))
    limit = bounds.max_structured_output_bytes
    name_one = "Name one function in `tool_choice`, or send fewer or smaller tools"
    if size > limit:
        raise refusal(
            "tools",
            f'`tool_choice` "required" joins the tools\' parameters into one schema of {size:,} bytes as '
            f"JSON; at most {limit:,} are taken. {name_one}.",
        )
    if json_nesting(schema) > MAX_SCHEMA_NESTING:
        raise refusal(
            "tools",
            f'`tool_choice` "required" nests each tool\'s parameters {CALLS_NESTING} levels deep into '
            f"one schema, which may nest at most {MAX_SCHEMA_NESTING} levels; a tool's parameters then "
            f"at most {MAX_SCHEMA_NESTING - CALLS_NESTING}. {name_one}, or flatten its parameters.",
        )
