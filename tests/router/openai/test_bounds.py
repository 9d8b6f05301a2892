"""router.openai.bounds: the rules behind the front door's request bounds, one at a time.

What each bound refuses through the running front door is in tests/router/scenarios/test_request_bounds.py;
here, the rules that must agree with an engine's (schema nesting, what makes a regex invalid) and
that an operator's settings move the bounds.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from router.openai.bounds import (
    MAX_SCHEMA_NESTING,
    check_chat_bounds,
    check_regex,
    check_sampling_bounds,
    json_nesting,
    template_chars,
)
from router.openai.chat import ChatCompletionRequest
from router.openai.completions import CompletionRequest
from router.openai.errors import InvalidRequestError
from switchboard.config import FrontDoorConfig, load_settings


def chat(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields}
    return msgspec.json.decode(msgspec.json.encode(body), type=ChatCompletionRequest)


def check_bounds(request: Any, bounds: FrontDoorConfig) -> None:
    if isinstance(request, ChatCompletionRequest):
        check_chat_bounds(request, bounds)
    else:
        check_sampling_bounds(request, bounds)


def refused(request: Any, bounds: FrontDoorConfig | None = None) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        check_bounds(request, bounds or FrontDoorConfig())
    return caught.value


@pytest.mark.parametrize(
    ("value", "depth"),
    [
        (1, 0),
        ("x", 0),
        ({}, 1),
        ([], 1),
        ({"a": 1}, 1),
        ([[1], {"a": {"b": []}}], 4),
        ({"a": [], "b": [[]]}, 3),
    ],
)
def test_json_nesting_counts_objects_and_arrays_as_vllm_does(value: Any, depth: int) -> None:
    # vLLM refuses a schema with containers at depth MAX + 1 (`_exceeds_json_nesting`).
    assert json_nesting(value) == depth


def test_json_nesting_of_a_deep_document_needs_no_recursion() -> None:
    value: Any = "leaf"
    for _ in range(5000):
        value = [value]
    assert json_nesting(value) == 5000


@pytest.mark.parametrize("pattern", ["(a", "a)", "(a))(", "\\((a", "x\x00"])
def test_a_regex_no_dialect_reads_is_refused(pattern: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        check_regex(pattern, "structured_outputs.regex")
    assert caught.value.param == "structured_outputs.regex"


@pytest.mark.parametrize(
    "pattern",
    # Valid, or valid in some dialect, or only the engine can tell (a class makes parentheses literal,
    # and what `]` first in a class means differs between dialects): left to the engine.
    ["", "\\(", "a\\)", "(a|b)+", "[(]", "[]()]", "(?<=a)b", "\\p{L}+", "a{2,1}"],
)
def test_a_regex_some_dialect_may_read_is_left_to_the_engine(pattern: str) -> None:
    check_regex(pattern, "structured_outputs.regex")


def test_the_rendered_estimate_counts_every_text_the_template_sees() -> None:
    calls = [{"id": "call1", "type": "function", "function": {"name": "add", "arguments": '{"a":1}'}}]
    request = chat(
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "ab"}, {"type": "text", "text": "c"}],
                "name": "ada",
            },
            {"role": "assistant", "tool_calls": calls},
            {"role": "tool", "tool_call_id": "call1", "content": "2"},
        ]
    )
    texts = len("abc") + len("ada") + len("call1") + len("add") + len('{"a":1}') + len("call1") + len("2")
    assert template_chars(request.messages) == texts + 3 * 32


def test_the_bounds_an_operator_may_raise_are_settings() -> None:
    settings = load_settings(
        environ={
            "SWITCHBOARD_ROUTER__MAX_MESSAGES": "3",
            "SWITCHBOARD_ROUTER__MAX_STRUCTURED_OUTPUT_CHOICES": "2",
            "SWITCHBOARD_ROUTER__MAX_STRUCTURED_OUTPUT_BYTES": "2048",
            "SWITCHBOARD_ROUTER__MAX_TOOLS_BYTES": "1024",
        }
    )
    bounds = settings.router
    assert refused(chat(messages=[{"role": "user", "content": "a"}] * 4), bounds).param == "messages"
    check_bounds(chat(messages=[{"role": "user", "content": "a"}] * 3), bounds)
    assert (
        refused(chat(structured_outputs={"choice": ["a", "b", "c"]}), bounds).param
        == "structured_outputs.choice"
    )
    assert (
        refused(chat(structured_outputs={"grammar": "x" * 2049}), bounds).param
        == "structured_outputs.grammar"
    )
    tools = [{"type": "function", "function": {"name": f"f{i}", "description": "d" * 100}} for i in range(10)]
    assert refused(chat(tools=tools), bounds).param == "tools"
    # The same requests pass the defaults.
    for fields in ({"structured_outputs": {"choice": ["a", "b", "c"]}}, {"tools": tools}):
        check_bounds(chat(**fields), FrontDoorConfig())


def test_completions_share_the_structured_output_and_stop_bounds() -> None:
    body = {"model": "m", "prompt": "Hi", "structured_outputs": {"json": {"a": {"b": {}}}}}
    request = msgspec.json.decode(msgspec.json.encode(body), type=CompletionRequest)
    check_bounds(request, FrontDoorConfig())
    deep: Any = {}
    for _ in range(MAX_SCHEMA_NESTING):
        deep = {"a": deep}
    body["structured_outputs"] = {"json": deep}
    error = refused(msgspec.json.decode(msgspec.json.encode(body), type=CompletionRequest))
    assert error.param == "structured_outputs.json" and str(MAX_SCHEMA_NESTING) in error.message
