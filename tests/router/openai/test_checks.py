"""router.openai.checks: what one field's type cannot refuse, each refusal a 400 naming its parameter."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from router.openai.chat import ChatCompletionRequest
from router.openai.checks import (
    MAX_CHOICES,
    MAX_PROMPTS,
    check_chat,
    check_completion,
    logit_bias_tokens,
    prompt_count,
)
from router.openai.common import INT32_MAX
from router.openai.completions import CompletionRequest
from router.openai.errors import InvalidRequestError

USER = {"role": "user", "content": "Hi"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


def chat(**fields: Any) -> ChatCompletionRequest:
    """A chat request decoded as the route decodes it (JSON through msgspec)."""
    body = {"model": "m", "messages": [USER], **fields}
    return msgspec.json.decode(msgspec.json.encode(body), type=ChatCompletionRequest)


def completion(**fields: Any) -> CompletionRequest:
    body = {"model": "m", "prompt": "Once upon a time", **fields}
    return msgspec.json.decode(msgspec.json.encode(body), type=CompletionRequest)


def refusal(check: Any, request: Any) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        check(request)
    assert caught.value.status_code == 400
    return caught.value


# --- chat: accepted -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]},
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                USER,
                {
                    "role": "assistant",
                    "content": [{"type": "refusal", "refusal": "I cannot."}, {"type": "text", "text": ""}],
                },
            ]
        },
        {
            "messages": [
                USER,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "42"},
            ]
        },
        {"logprobs": True, "top_logprobs": 5},
        {"logprobs": True},
        {"stream": True, "stream_options": {"include_usage": True}},
        {"modalities": ["text"], "store": False, "service_tier": "auto"},
        {"service_tier": "default", "audio": None},
        {"service_tier": "flex"},
        {"service_tier": "priority"},
        {"tools": [WEATHER, TIME]},
        {"tools": [WEATHER], "tool_choice": "none"},
        {"tools": [WEATHER], "tool_choice": "auto", "response_format": {"type": "json_object"}},
        {"tools": [WEATHER, TIME], "tool_choice": "required"},
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "text"}},
        {"tool_choice": "none"},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
        {"structured_outputs": {"regex": "[a-z]+"}},
        {"structured_outputs": {"choice": ["yes", "no"]}, "response_format": {"type": "text"}},
        {"logit_bias": {"0": -100, "2147483647": 100}},
    ],
    ids=lambda fields: ",".join(fields) or "minimal",
)
def test_chat_accepts(fields: dict[str, Any]) -> None:
    check_chat(chat(**fields))


# --- chat: refused --------------------------------------------------------------------------------

CHAT_REFUSALS: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "stream options without stream",
        {"stream_options": {"include_usage": True}},
        "stream_options",
        "invalid_value",
    ),
    ("logit bias key not a token id", {"logit_bias": {"hello": 1}}, "logit_bias", "invalid_value"),
    (
        "two structured constraints",
        {"structured_outputs": {"regex": "a", "choice": ["a"]}},
        "structured_outputs",
        "invalid_value",
    ),
    (
        "no structured constraint",
        {"structured_outputs": {"json_object": False}},
        "structured_outputs",
        "invalid_value",
    ),
    ("audio", {"audio": {"voice": "alloy", "format": "mp3"}}, "audio", "unsupported_parameter"),
    ("audio modality", {"modalities": ["text", "audio"]}, "modalities", "unsupported_parameter"),
    (
        "prediction",
        {"prediction": {"type": "content", "content": "x"}},
        "prediction",
        "unsupported_parameter",
    ),
    ("web search", {"web_search_options": {}}, "web_search_options", "unsupported_parameter"),
    ("functions", {"functions": [{"name": "f"}]}, "functions", "unsupported_parameter"),
    ("function_call", {"function_call": "auto"}, "function_call", "unsupported_parameter"),
    ("store", {"store": True}, "store", "unsupported_parameter"),
    ("reasoning effort", {"reasoning_effort": "low"}, "reasoning_effort", "unsupported_parameter"),
    ("verbosity", {"verbosity": "low"}, "verbosity", "unsupported_parameter"),
    (
        "image part without its image",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}]},
        "messages[0].content[1].image_url",
        "invalid_value",
    ),
    (
        "audio part in a later message",
        {"messages": [USER, {"role": "user", "content": [{"type": "input_audio"}]}]},
        "messages[1].content[0].type",
        "unsupported_content",
    ),
    (
        "unknown part",
        {"messages": [{"role": "user", "content": [{"type": "hologram"}]}]},
        "messages[0].content[0].type",
        "invalid_value",
    ),
    (
        "text part without text",
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        "messages[0].content[0].text",
        "invalid_value",
    ),
    (
        "refusal part without refusal",
        {"messages": [{"role": "assistant", "content": [{"type": "refusal"}]}]},
        "messages[0].content[0].type",
        "invalid_value",
    ),
    (
        "tool message without its call id",
        {"messages": [USER, {"role": "tool", "content": "42"}]},
        "messages[1].tool_call_id",
        "invalid_value",
    ),
    (
        "tool calls on a user message",
        {
            "messages": [
                {
                    "role": "user",
                    "content": "x",
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
                }
            ]
        },
        "messages[0].tool_calls",
        "invalid_value",
    ),
    ("user without content", {"messages": [{"role": "user"}]}, "messages[0].content", "invalid_value"),
    (
        "assistant without content or calls",
        {"messages": [USER, {"role": "assistant", "content": None}]},
        "messages[1].content",
        "invalid_value",
    ),
    ("top_logprobs without logprobs", {"top_logprobs": 3}, "top_logprobs", "invalid_value"),
    (
        "top_logprobs with logprobs false",
        {"logprobs": False, "top_logprobs": 0},
        "top_logprobs",
        "invalid_value",
    ),
    (
        "two tools with one name",
        {"tools": [WEATHER, WEATHER], "tool_choice": "none"},
        "tools",
        "invalid_value",
    ),
    ("required without tools", {"tool_choice": "required"}, "tool_choice", "invalid_value"),
    ("auto without tools", {"tool_choice": "auto"}, "tool_choice", "invalid_value"),
    (
        "named function not among tools",
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
        "tool_choice",
        "invalid_value",
    ),
    (
        "required with a response format",
        {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
        "response_format",
        "invalid_value",
    ),
    (
        "named with structured outputs",
        {
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "structured_outputs": {"regex": "a"},
        },
        "structured_outputs",
        "invalid_value",
    ),
    (
        "structured outputs and a response format",
        {"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
        "structured_outputs",
        "invalid_value",
    ),
]


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [case[1:] for case in CHAT_REFUSALS],
    ids=[case[0] for case in CHAT_REFUSALS],
)
def test_chat_refuses(fields: dict[str, Any], param: str, code: str) -> None:
    error = refusal(check_chat, chat(**fields))
    assert (error.param, error.code) == (param, code)
    assert error.body().error.type == "invalid_request_error"


def test_unsupported_parameter_says_why() -> None:
    error = refusal(check_chat, chat(functions=[{"name": "f"}]))
    assert error.message.startswith("`functions` is not supported: ")
    assert "`tools`" in error.message


def test_named_function_refusal_lists_the_tools() -> None:
    fields = {
        "tools": [WEATHER, TIME],
        "tool_choice": {"type": "function", "function": {"name": "get_news"}},
    }
    error = refusal(check_chat, chat(**fields))
    assert "get_news" in error.message
    assert "get_weather, get_time" in error.message


def test_an_empty_json_schema_is_a_constraint() -> None:
    check_chat(chat(structured_outputs={"json": {}}))


def test_an_empty_json_schema_beside_another_constraint_is_refused() -> None:
    error = refusal(check_chat, chat(structured_outputs={"json": {}, "regex": "a+"}))
    assert error.param == "structured_outputs"


# --- completions ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "prompts"),
    [
        ({}, 1),
        ({"prompt": ["a", "b", "c"], "n": 2}, 3),
        ({"prompt": [1, 2, 3]}, 1),
        ({"prompt": [[1, 2], [3]], "n": MAX_CHOICES // 2}, 2),
        ({"best_of": 3, "n": 3}, 1),
        ({"suffix": ""}, 1),
        ({"prompt": list(range(1000)), "n": MAX_CHOICES}, 1),
        ({"stream": True, "stream_options": {"include_usage": False}}, 1),
    ],
)
def test_completion_accepts_and_counts_prompts(fields: dict[str, Any], prompts: int) -> None:
    assert check_completion(completion(**fields)) == prompts


COMPLETION_REFUSALS: list[tuple[str, dict[str, Any], str, str]] = [
    ("suffix", {"suffix": "the end"}, "suffix", "unsupported_parameter"),
    ("best_of above n", {"best_of": 2}, "best_of", "unsupported_parameter"),
    ("best_of below n", {"best_of": 1, "n": 2}, "best_of", "unsupported_parameter"),
    ("too many choices", {"prompt": ["a", "b", "c"], "n": 43}, "n", "invalid_value"),
    (
        "stream options without stream",
        {"stream_options": {"include_usage": True}},
        "stream_options",
        "invalid_value",
    ),
    ("logit bias key", {"logit_bias": {"-1": 1}}, "logit_bias", "invalid_value"),
    ("empty prompt", {"prompt": ""}, "prompt", "invalid_value"),
    (
        "structured outputs with two kinds",
        {"structured_outputs": {"json_object": True, "grammar": "root ::= 'a'"}},
        "structured_outputs",
        "invalid_value",
    ),
]


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [case[1:] for case in COMPLETION_REFUSALS],
    ids=[case[0] for case in COMPLETION_REFUSALS],
)
def test_completion_refuses(fields: dict[str, Any], param: str, code: str) -> None:
    error = refusal(check_completion, completion(**fields))
    assert (error.param, error.code) == (param, code)


def test_choices_at_the_limit_pass() -> None:
    assert check_completion(completion(prompt=["a", "b"], n=MAX_CHOICES // 2)) == 2
    error = refusal(check_completion, completion(prompt=["a", "b", "c"], n=MAX_CHOICES // 2))
    assert str(MAX_CHOICES) in error.message


# --- prompt shapes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "count"),
    [
        ("text", 1),
        ([0, 5, INT32_MAX], 1),
        (["a"], 1),
        (["a", "b"], 2),
        ([[1], [2, 3], [4]], 3),
        (["a", [1, 2]], 2),
        (["p"] * MAX_PROMPTS, MAX_PROMPTS),
    ],
)
def test_prompt_count(prompt: Any, count: int) -> None:
    assert prompt_count(prompt) == count


@pytest.mark.parametrize(
    ("prompt", "param"),
    [
        ("", "prompt"),
        ([], "prompt"),
        (["p"] * (MAX_PROMPTS + 1), "prompt"),
        (["a", ""], "prompt[1]"),
        (["a", []], "prompt[1]"),
        ([[1, 2], [3, -1]], "prompt[1]"),
        ([[1], [INT32_MAX + 1]], "prompt[1]"),
        ([[1], [True]], "prompt[1]"),
        (["a", 3], "prompt[1]"),
        (["a", None], "prompt[1]"),
        ([True], "prompt[0]"),
        ([1.5], "prompt[0]"),
        ([{"text": "a"}], "prompt[0]"),
    ],
)
def test_prompt_shape_refusals_name_the_prompt(prompt: Any, param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        prompt_count(prompt)
    assert (caught.value.param, caught.value.code) == (param, "invalid_value")


def test_a_bad_token_id_is_named_where_it_is() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        prompt_count([17, 42, -1])
    assert caught.value.param == "prompt[2]"


# --- logit_bias -----------------------------------------------------------------------------------


def test_logit_bias_keys_become_token_ids() -> None:
    assert logit_bias_tokens({"0": -100.0, "42": 2.5, str(INT32_MAX): 100.0}) == {
        0: -100.0,
        42: 2.5,
        INT32_MAX: 100.0,
    }


@pytest.mark.parametrize("empty", [None, {}])
def test_no_logit_bias_is_none(empty: dict[str, float] | None) -> None:
    assert logit_bias_tokens(empty) is None


@pytest.mark.parametrize("key", ["-1", "05", "+5", "1.0", "1_000", "1e3", "abc", "", str(INT32_MAX + 1), "٣"])
def test_logit_bias_keys_that_are_not_token_ids(key: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        logit_bias_tokens({"7": 1.0, key: 1.0})
    assert (caught.value.param, caught.value.code) == ("logit_bias", "invalid_value")
    assert repr(key) in caught.value.message
