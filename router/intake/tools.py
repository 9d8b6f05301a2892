"""Tool calls through structured output: what a chat request's `tool_choice` makes the engine generate,
and how the generated text becomes OpenAI's `tool_calls`.

A named `tool_choice` constrains the output to the function's arguments schema, and `required` to a
JSON list of calls, so both work on any model without a tool-call parser. `auto` lets the model
decide, in its own tool-call syntax, which the worker parses with the model's configured
`tool_call_parser`; on a model without one it is refused with a clear 400 rather than answered with
text the client would have to parse itself.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

import msgspec

from router.openai.chat import ChatCompletionRequest, NamedToolChoice, Tool
from router.openai.errors import InvalidRequestError
from router.openai.required_calls import NO_ARGUMENTS, calls_schema
from switchboard.wire import StructuredOutput

ToolMode = Literal["text", "named", "required", "auto"]


class ToolPlan(msgspec.Struct, frozen=True, kw_only=True):
    """How a chat request's answer relates to its tools."""

    mode: ToolMode = "text"
    # The function a named choice calls.
    function: str | None = None


TEXT = ToolPlan()


def plan_tools(
    request: ChatCompletionRequest, model: str, tool_call_parser: str | None
) -> tuple[ToolPlan, StructuredOutput | None]:
    """The plan for `request`, and the structured output it needs (None: plain text)."""
    choice = request.tool_choice
    if not request.tools or choice == "none":
        return TEXT, None
    if (choice is None or choice == "auto") and tool_call_parser is not None:
        return ToolPlan(mode="auto"), None
    if choice is None or choice == "auto":
        raise InvalidRequestError(
            f'`tool_choice` "auto" (the default when `tools` are given) needs a tool-call parser for '
            f"the model's own tool-call format, and `{model}` has none configured (its "
            '`tool_call_parser` setting). Set `tool_choice` to "required" or to a named function '
            '(both work on any model), or to "none".',
            param="tool_choice",
            code="unsupported_parameter",
        )
    if isinstance(choice, NamedToolChoice):
        tool = _tool(request.tools, choice.function.name)
        schema = tool.function.parameters or NO_ARGUMENTS
        return ToolPlan(mode="named", function=tool.function.name), _schema_output(schema)
    # Its size and nesting passed the gate (`router.openai.bounds.check_required_calls`).
    calls = calls_schema(request.tools, request.parallel_tool_calls)
    return ToolPlan(mode="required"), _schema_output(calls)


def new_call_id() -> str:
    """An id for a tool call, in OpenAI's style."""
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_required_calls(text: str) -> list[tuple[str, str]] | None:
    """The (name, arguments JSON) of each call in a `required` answer; None if it is not one."""
    try:
        calls = json.loads(text)
    except ValueError:
        return None
    if not isinstance(calls, list) or not calls:
        return None
    parsed: list[tuple[str, str]] = []
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        parsed.append((call["name"], json.dumps(call.get("parameters", {}), ensure_ascii=False)))
    return parsed


def _tool(tools: list[Tool], name: str) -> Tool:
    return next(tool for tool in tools if tool.function.name == name)


def _schema_output(schema: dict[str, Any]) -> StructuredOutput:
    return StructuredOutput(json_schema=json.dumps(schema, ensure_ascii=False))
