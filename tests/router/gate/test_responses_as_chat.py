"""A Responses request as the chat request that answers it (`router.gate.responses_as_chat`)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from router.gate.responses_as_chat import chat_request, in_responses_terms
from router.openai.chat import JsonObjectFormat, JsonSchemaFormat, NamedToolChoice
from router.openai.errors import InvalidRequestError
from router.openai.responses import ResponsesRequest


def converted(**body: Any) -> Any:
    return chat_request(msgspec.convert({"model": "m", **body}, ResponsesRequest))


def messages(**body: Any) -> list[dict[str, Any]]:
    return [without_nones(msgspec.to_builtins(message)) for message in converted(**body).messages]


def without_nones(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_nones(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nones(v) for v in value]
    return value


def test_instructions_and_a_string_are_a_system_and_a_user_message() -> None:
    assert messages(instructions="Be brief.", input="Hi") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]


def test_items_keep_their_roles_and_text_parts() -> None:
    items = [
        {"role": "developer", "content": "Rules."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello", "annotations": []}]},
    ]
    assert messages(input=items) == [
        {"role": "developer", "content": "Rules."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
    ]


def test_calls_in_a_row_are_one_assistant_message_and_outputs_are_tool_messages() -> None:
    items = [
        {"role": "user", "content": "Weather and time?"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "Noon"}]},
    ]
    result = messages(input=items)
    assert result[0] == {"role": "user", "content": "Weather and time?"}
    assert result[1]["role"] == "assistant" and "content" not in result[1]
    assert [(c["id"], c["function"]["name"]) for c in result[1]["tool_calls"]] == [
        ("c1", "get_weather"),
        ("c2", "get_time"),
    ]
    assert result[2:] == [
        {"role": "tool", "content": "Sunny", "tool_call_id": "c1"},
        {"role": "tool", "content": [{"type": "text", "text": "Noon"}], "tool_call_id": "c2"},
    ]


def test_a_call_after_the_assistants_text_joins_its_message() -> None:
    items = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me look."},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
    ]
    result = messages(input=items)
    assert len(result) == 2
    assert result[1]["content"] == "Let me look." and result[1]["tool_calls"][0]["id"] == "c1"


def test_sampling_tools_and_formats_carry_over() -> None:
    tool = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}
    chat = converted(
        input="Hi",
        max_output_tokens=7,
        temperature=0.5,
        top_p=0.9,
        tools=[tool],
        tool_choice={"type": "function", "name": "get_time"},
        stream=True,
    )
    assert (chat.max_completion_tokens, chat.temperature, chat.top_p, chat.stream) == (7, 0.5, 0.9, True)
    assert chat.tools[0].function.name == "get_time"
    assert chat.tool_choice == NamedToolChoice(
        type="function", function=msgspec.convert({"name": "get_time"}, type(chat.tool_choice.function))
    )
    assert isinstance(
        converted(input="Hi", text={"format": {"type": "json_object"}}).response_format, JsonObjectFormat
    )
    schema_format = converted(
        input="Hi", text={"format": {"type": "json_schema", "name": "p", "schema": {"type": "object"}}}
    ).response_format
    assert isinstance(schema_format, JsonSchemaFormat) and schema_format.json_schema.schema == {
        "type": "object"
    }


def test_logprobs_are_asked_through_include() -> None:
    chat = converted(input="Hi", include=["message.output_text.logprobs"], top_logprobs=3)
    assert chat.logprobs and chat.top_logprobs == 3
    plain = converted(input="Hi", top_logprobs=3, include=["reasoning.encrypted_content"])
    assert not plain.logprobs and plain.top_logprobs is None


def test_what_changes_nothing_is_accepted() -> None:
    chat = converted(
        input="Hi",
        store=True,
        reasoning={"effort": None, "summary": None},
        truncation="disabled",
        service_tier="auto",
        text={"format": {"type": "text"}, "verbosity": "medium"},
        metadata={"a": "b"},
        parallel_tool_calls=False,
    )
    assert chat.metadata == {"a": "b"} and chat.parallel_tool_calls is False


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "Hi", "conversation": "conv_1"}, "conversation"),
        ({"input": "Hi", "prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"input": "Hi", "reasoning": {"effort": "high"}}, "reasoning"),
        ({"input": "Hi", "service_tier": "scale"}, "service_tier"),
        ({"input": "Hi", "text": {"verbosity": "low"}}, "text.verbosity"),
        ({"input": [{"content": "no role"}]}, "input[0].role"),
        ({"input": [{"role": "user"}]}, "input[0].content"),
        ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
        ({"input": [{"type": "computer_call", "id": "x"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "reasoning", "id": "rs"}]}, "input"),
        ({"input": "Hi", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"input": "Hi", "tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"input": "Hi", "tool_choice": "required"}, "tool_choice"),
        ({"input": "Hi", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_it(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        converted(**body)
    assert caught.value.param == param, caught.value.message


def test_errors_found_on_the_chat_request_speak_of_the_responses_fields() -> None:
    too_long = InvalidRequestError(
        "Reduce the length of the messages or of the completion (max_tokens).", param="max_tokens", code="c"
    )
    translated = in_responses_terms(too_long)
    assert translated.message == "Reduce the length of the input or of the completion (max_output_tokens)."
    assert (translated.param, translated.code) == ("max_output_tokens", "c")
    assert (
        in_responses_terms(InvalidRequestError("Bad.", param="messages[2].content")).param
        == "input[2].content"
    )
    assert in_responses_terms(InvalidRequestError("x", param="response_format")).param == "text.format"
    unchanged = InvalidRequestError("`temperature` is too high.", param="temperature")
    assert in_responses_terms(unchanged) is unchanged
