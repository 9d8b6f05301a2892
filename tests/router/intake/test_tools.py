"""router.intake.tools: what a chat request's tool_choice makes the engine generate, and back."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from router.intake.tools import NO_ARGUMENTS, TEXT, ToolPlan, new_call_id, parse_required_calls, plan_tools
from router.openai.chat import ChatCompletionRequest
from router.openai.errors import InvalidRequestError
from switchboard.wire import StructuredOutput

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def chat(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields}
    return msgspec.json.decode(msgspec.json.encode(body), type=ChatCompletionRequest)


def schema_of(structured: StructuredOutput | None) -> Any:
    assert structured is not None and structured.json_schema is not None
    assert not (structured.json_object or structured.regex or structured.choice or structured.grammar)
    return json.loads(structured.json_schema)


@pytest.mark.parametrize(
    "fields",
    [{}, {"tool_choice": "none"}, {"tools": [WEATHER], "tool_choice": "none"}],
)
@pytest.mark.parametrize("parser", [None, "hermes"])
def test_plain_text(fields: dict[str, Any], parser: str | None) -> None:
    assert plan_tools(chat(**fields), "m", parser) == (TEXT, None)


@pytest.mark.parametrize("fields", [{"tools": [WEATHER]}, {"tools": [WEATHER], "tool_choice": "auto"}])
def test_auto_with_a_parser(fields: dict[str, Any]) -> None:
    assert plan_tools(chat(**fields), "m", "hermes") == (ToolPlan(mode="auto"), None)


@pytest.mark.parametrize("fields", [{"tools": [WEATHER]}, {"tools": [WEATHER], "tool_choice": "auto"}])
def test_auto_without_a_parser_is_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        plan_tools(chat(**fields), "tiny-model", None)
    assert caught.value.status_code == 400
    assert (caught.value.param, caught.value.code) == ("tool_choice", "unsupported_parameter")
    assert "`tiny-model`" in caught.value.message
    assert "tool_call_parser" in caught.value.message


def test_named_choice_constrains_to_the_function_parameters() -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    plan, structured = plan_tools(chat(tools=[TIME, WEATHER], tool_choice=choice), "m", None)
    assert plan == ToolPlan(mode="named", function="get_weather")
    assert schema_of(structured) == CITY


def test_named_choice_of_a_function_without_parameters() -> None:
    choice = {"type": "function", "function": {"name": "get_time"}}
    plan, structured = plan_tools(chat(tools=[WEATHER, TIME], tool_choice=choice), "m", "hermes")
    assert plan == ToolPlan(mode="named", function="get_time")
    assert schema_of(structured) == NO_ARGUMENTS


@pytest.mark.parametrize(("parallel", "max_items"), [(None, None), (True, None), (False, 1)])
def test_required_is_a_list_of_calls(parallel: bool | None, max_items: int | None) -> None:
    fields: dict[str, Any] = {"tools": [WEATHER, TIME], "tool_choice": "required"}
    if parallel is not None:
        fields["parallel_tool_calls"] = parallel
    plan, structured = plan_tools(chat(**fields), "m", None)
    assert plan == ToolPlan(mode="required")
    schema = schema_of(structured)
    assert schema["type"] == "array"
    assert schema["minItems"] == 1
    assert schema.get("maxItems") == max_items
    calls = schema["items"]["anyOf"]
    assert calls == [
        {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": ["get_weather"]}, "parameters": CITY},
            "required": ["name", "parameters"],
        },
        {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": ["get_time"]}, "parameters": NO_ARGUMENTS},
            "required": ["name", "parameters"],
        },
    ]


def test_required_wins_over_a_parser() -> None:
    plan, structured = plan_tools(chat(tools=[WEATHER], tool_choice="required"), "m", "hermes")
    assert plan.mode == "required"
    assert structured is not None


def test_call_ids() -> None:
    first, second = new_call_id(), new_call_id()
    assert first.startswith("call_") and len(first) == len("call_") + 24
    assert first != second


def test_parse_required_calls() -> None:
    text = (
        '[{"name": "get_weather", "parameters": {"city": "Zürich"}}, {"name": "get_time", "parameters": {}}]'
    )
    calls = parse_required_calls(text)
    assert calls is not None
    assert [name for name, _ in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0][1]) == {"city": "Zürich"}
    assert "Zürich" in calls[0][1]  # not escaped to \u00fc
    assert json.loads(calls[1][1]) == {}


def test_a_call_without_parameters_has_empty_arguments() -> None:
    assert parse_required_calls('[{"name": "get_time"}]') == [("get_time", "{}")]


@pytest.mark.parametrize(
    "text",
    [
        "",
        '[{"name": "get_weather", "parameters": {"ci',  # cut short by max_tokens
        "[]",
        '{"name": "get_weather", "parameters": {}}',
        '["get_weather"]',
        '[{"parameters": {}}]',
        '[{"name": 3, "parameters": {}}]',
        '[{"name": "a", "parameters": {}}, 7]',
        "Sure! I will call get_weather.",
    ],
)
def test_text_that_is_not_a_list_of_calls(text: str) -> None:
    assert parse_required_calls(text) is None
