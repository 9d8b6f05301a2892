"""The OpenAI text surface through every real part, checked for meaning, not only shape.

The official `openai` client → front door → Redis → worker (PyTriton + vLLM CPU) on the tiny demo
model: several choices, log probabilities, logit bias, penalties, structured output, forced tool
calls, plain completions in all their prompt forms, and the bad requests that must be 4xx.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from tests.support.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

MESSAGES: list[Any] = [{"role": "user", "content": "Tell me a story about the sea."}]
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(demo_model_dir))


# --- several choices --------------------------------------------------------------------------------


def test_n_gives_distinct_choices_and_usage_counts_them_all(client: OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, n=3, temperature=1.0, max_tokens=12, seed=3
    )
    assert [c.index for c in completion.choices] == [0, 1, 2]
    texts = [c.message.content for c in completion.choices]
    assert all(texts) and len(set(texts)) == 3, texts
    assert completion.usage is not None
    assert completion.usage.completion_tokens > 12  # three choices' tokens, not one's
    assert completion.usage.completion_tokens <= 36


def test_streamed_choices_are_indexed_and_reassemble(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        n=2,
        temperature=1.0,
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts: dict[int, str] = {0: "", 1: ""}
    roles: dict[int, int] = {0: 0, 1: 0}
    finishes: dict[int, str | None] = {}
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            roles[choice.index] += choice.delta.role == "assistant"
            if choice.finish_reason is not None:
                finishes[choice.index] = choice.finish_reason
    assert roles == {0: 1, 1: 1}  # each choice's first event carries the role, once
    assert set(finishes) == {0, 1}
    assert texts[0] and texts[1]
    assert usage is not None and usage.completion_tokens <= 20 and usage.completion_tokens > 10


# --- log probabilities and logit bias ----------------------------------------------------------------


def test_logprobs_are_finite_sorted_and_the_greedy_token_is_the_top_one(client: OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
    )
    choice = completion.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    content = choice.logprobs.content
    assert "".join(entry.token for entry in content) == choice.message.content
    for entry in content:
        assert math.isfinite(entry.logprob) and entry.logprob <= 0
        assert entry.bytes == list(entry.token.encode())
        tops = [top.logprob for top in entry.top_logprobs]
        assert len(tops) == 3
        assert tops == sorted(tops, reverse=True)
        assert all(math.isfinite(value) for value in tops)
        # Greedy decoding picks the most likely token.
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-4)


def test_logit_bias_of_plus_100_forces_its_token(client: OpenAI, tokenizer: Any) -> None:
    token_id = tokenizer.convert_tokens_to_ids("a")
    assert isinstance(token_id, int) and token_id != tokenizer.unk_token_id
    completion = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, temperature=1.0, logit_bias={str(token_id): 100}
    )
    assert completion.choices[0].message.content == tokenizer.decode([token_id] * 6)


def test_logit_bias_outside_the_vocabulary_is_a_400(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, logit_bias={"99999": 5})
    assert caught.value.body["param"] == "logit_bias"  # type: ignore[index]


def test_frequency_penalty_curbs_repetition(client: OpenAI) -> None:
    def most_repeated(**penalty: float) -> int:
        completion = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=60, temperature=0, logprobs=True, **penalty
        )
        tokens = [entry.token for entry in completion.choices[0].logprobs.content]  # type: ignore[union-attr]
        return max(Counter(tokens).values())

    assert most_repeated(frequency_penalty=2.0) < most_repeated()
    assert most_repeated(presence_penalty=2.0) < most_repeated()


# --- structured output and tools ---------------------------------------------------------------------


def test_json_schema_answer_parses_and_validates(client: OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,10}$"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    completion = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=60,
        temperature=1.0,
        seed=11,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
    )
    answer = json.loads(completion.choices[0].message.content or "")
    assert set(answer) == {"name", "age"}
    assert isinstance(answer["name"], str) and re.fullmatch("[a-z]{1,10}", answer["name"])
    assert isinstance(answer["age"], int)


def test_json_object_answer_is_an_object(client: OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=40, temperature=0, response_format={"type": "json_object"}
    )
    choice = completion.choices[0]
    if choice.finish_reason == "stop":  # cut short by max_tokens, the object may be unfinished
        assert isinstance(json.loads(choice.message.content or ""), dict)
    assert (choice.message.content or "").lstrip().startswith("{")


def test_a_forced_tool_call_parses_into_tool_calls(client: OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
        tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=60,
        temperature=1.0,
        seed=5,
    )
    message = completion.choices[0].message
    assert message.content is None
    (call,) = message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city", "days"}
    assert isinstance(arguments["city"], str) and isinstance(arguments["days"], int)


def test_a_streamed_forced_tool_call_reassembles(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=60,
        temperature=1.0,
        seed=5,
        stream=True,
    )
    names, ids, arguments = [], [], ""
    for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                assert call.index == 0
                names += [call.function.name] if call.function and call.function.name else []
                ids += [call.id] if call.id else []
                arguments += call.function.arguments or "" if call.function else ""
    assert names == ["get_weather"] and len(ids) == 1
    assert set(json.loads(arguments)) == {"city", "days"}


def test_required_tool_choice_calls_one_of_the_tools(client: OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What time is it?"}],
        tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=80,
        temperature=1.0,
        seed=2,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name in {"get_weather", "get_time"}
    assert isinstance(json.loads(call.function.arguments), dict)


# The shared stack's model parses tool calls in the "pythonic" syntax: `[name(arg=value, ...)]`.
# (No space in it: the demo tokenizer spells spaces as "▁", which xgrammar does not map back.)
OSLO_CALL = r"\[get_weather\(city='Oslo',days=2\)\]"


def test_auto_tool_choice_parses_the_models_own_tool_call_syntax(client: OpenAI) -> None:
    # A random model never writes a call by itself: vLLM's regex constraint makes it write one.
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[WEATHER_TOOL, TIME_TOOL],
        max_tokens=40,
        extra_body={"structured_outputs": {"regex": OSLO_CALL}},
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo", "days": 2}
    assert not choice.message.content


def test_auto_tool_choice_streamed_and_without_a_call(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        max_tokens=40,
        stream=True,
        extra_body={"structured_outputs": {"regex": OSLO_CALL}},
    )
    calls = [call for chunk in stream for choice in chunk.choices for call in choice.delta.tool_calls or []]
    (call,) = calls
    assert call.function is not None and call.function.name == "get_weather"
    assert json.loads(call.function.arguments or "") == {"city": "Oslo", "days": 2}
    # Text that is no call stays text.
    plain = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=[WEATHER_TOOL], max_tokens=8, temperature=0
    )
    assert plain.choices[0].message.content and not plain.choices[0].message.tool_calls
    assert plain.choices[0].finish_reason == "length"


def test_vllm_structured_outputs_choice_and_regex(client: OpenAI) -> None:
    picked = client.completions.create(
        model=MODEL,
        prompt="Pick one:",
        max_tokens=10,
        extra_body={"structured_outputs": {"choice": ["red", "green", "blue"]}},
    )
    assert picked.choices[0].text in {"red", "green", "blue"}
    number = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=10,
        extra_body={"structured_outputs": {"regex": "[0-9]{3}"}},
    )
    assert re.fullmatch("[0-9]{3}", number.choices[0].message.content or "")


def test_a_conversation_with_tool_results_is_answered(client: OpenAI) -> None:
    messages: list[Any] = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 1}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    ]
    completion = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=5
    )
    assert completion.choices[0].message.content


# --- plain completions --------------------------------------------------------------------------------


def test_completion_of_one_prompt_matches_chat_free_generation(client: OpenAI) -> None:
    completion = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0
    )
    assert completion.object == "text_completion"
    assert completion.id.startswith("cmpl-")
    (choice,) = completion.choices
    assert choice.text and choice.finish_reason in ("stop", "length")
    assert completion.usage is not None and completion.usage.completion_tokens <= 10
    again = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0)
    assert again.choices[0].text == choice.text


def test_completion_prompts_in_every_form_number_their_choices(client: OpenAI, tokenizer: Any) -> None:
    ids = tokenizer.encode("Once upon a time")
    single_text = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0
    )
    single_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    assert single_ids.choices[0].text == single_text.choices[0].text
    several = client.completions.create(
        model=MODEL, prompt=["Once upon a time", "The sea"], n=2, max_tokens=6, temperature=0
    )
    assert [c.index for c in several.choices] == [0, 1, 2, 3]
    # Greedy: both choices of a prompt agree, and the first prompt's equal the single completion.
    assert several.choices[0].text == several.choices[1].text == single_text.choices[0].text
    assert several.choices[2].text == several.choices[3].text
    assert several.usage is not None
    one_prompt = single_text.usage.prompt_tokens  # type: ignore[union-attr]
    assert several.usage.prompt_tokens > one_prompt
    lists = client.completions.create(model=MODEL, prompt=[ids, ids[:2]], max_tokens=6, temperature=0)
    assert [c.index for c in lists.choices] == [0, 1]
    assert lists.choices[0].text == single_text.choices[0].text


def test_echo_and_logprobs_of_a_completion(client: OpenAI) -> None:
    prompt = "Once upon a time"
    completion = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=5, temperature=0, echo=True, logprobs=2
    )
    choice = completion.choices[0]
    assert choice.text.startswith(prompt)
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs and logprobs.text_offset
    # The prompt's tokens include its BOS token, which its text does not show.
    assert "".join(logprobs.tokens).removeprefix("<s>") == choice.text
    count = len(logprobs.tokens)
    assert (
        len(logprobs.token_logprobs) == len(logprobs.text_offset) == len(logprobs.top_logprobs or []) == count
    )
    assert logprobs.token_logprobs[0] is None  # the prompt's first token has nothing before it
    assert all(value is not None and math.isfinite(value) for value in logprobs.token_logprobs[1:])
    assert logprobs.text_offset == sorted(logprobs.text_offset) and logprobs.text_offset[0] == 0
    for top in (logprobs.top_logprobs or [])[1:]:
        assert top is not None and 1 <= len(top) <= 3


def test_streamed_completion_reassembles_with_usage(client: OpenAI) -> None:
    whole = client.completions.create(model=MODEL, prompt="The sea", max_tokens=12, temperature=0)
    stream = client.completions.create(
        model=MODEL,
        prompt="The sea",
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    for chunk in stream:
        assert chunk.object == "text_completion"
        text += "".join(choice.text for choice in chunk.choices)
        usage = chunk.usage or usage
    assert text == whole.choices[0].text
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]


def test_suffix_is_refused_by_name(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="a", suffix="b", max_tokens=3)
    assert caught.value.body["param"] == "suffix"  # type: ignore[index]


# --- bounds -------------------------------------------------------------------------------------------


def test_max_tokens_beyond_the_context_is_refused_not_clamped(client: OpenAI) -> None:
    for create in (
        lambda: client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5000),
        lambda: client.completions.create(model=MODEL, prompt="a b c", max_tokens=1023),
        lambda: client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1020, stream=True),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            create()
        assert caught.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
        assert caught.value.body["param"] == "max_tokens"  # type: ignore[index]


def test_a_huge_prompt_is_refused_before_it_is_queued(stack: Stack) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 3_000_000}], "max_tokens": 3}
    started = time.monotonic()
    response = httpx.post(f"{stack.base_url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
    assert time.monotonic() - started < 5


def test_a_structured_output_the_engine_refuses_is_a_400_not_an_engine_error(client: OpenAI) -> None:
    # A lookbehind: Python's `re` reads it, the engine's dialect does not, so only the engine can
    # refuse it; its refusal must reach the client as the client's error, streamed or not.
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,
                max_tokens=5,
                stream=stream,
                extra_body={"structured_outputs": {"regex": "(?<=a)b"}},
            )
        error: Any = caught.value.body
        assert error["type"] == "invalid_request_error" and "Lookbehind" in error["message"], error
    # What the front door can count is refused there: 12,000 choices once kept the engine busy 28 s.
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(
            model=MODEL,
            prompt="Pick one:",
            max_tokens=5,
            extra_body={"structured_outputs": {"choice": [f"choice {i}" for i in range(12_000)]}},
        )
    assert caught.value.body["param"] == "structured_outputs.choice"  # type: ignore[index]
    # The model serves on.
    assert client.completions.create(model=MODEL, prompt="a", max_tokens=2).choices[0].text is not None


def test_image_parts_and_unsupported_parameters_are_refused_by_name(client: OpenAI) -> None:
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]
    cases: list[tuple[dict[str, Any], str]] = [
        # Remote image URLs are off by default (`router.image_urls`).
        ({"messages": image}, "messages[0].content[0].image_url"),
        ({"messages": MESSAGES, "seed": 2**64}, "seed"),
        ({"messages": MESSAGES, "stream_options": {"include_usage": True}}, "stream_options"),
        ({"messages": MESSAGES, "modalities": ["text", "audio"]}, "modalities"),
        ({"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
    ]
    for fields, param in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=MODEL, max_tokens=3, **fields)
        assert caught.value.body["param"] == param, caught.value.body  # type: ignore[index]


def test_retrieve_a_model_and_a_404_for_an_unknown_one(client: OpenAI) -> None:
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_a_client_that_leaves_a_non_streamed_request_cancels_its_job(stack: Stack) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 900, "min_tokens": 900}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{stack.base_url}/v1/chat/completions", json=body, timeout=1.0)

    def idle() -> bool:
        status = httpx.get(f"{stack.base_url}/admin/models/{MODEL}", timeout=10).json()
        return int(status["in_flight"]) == 0

    # 900 tokens take far longer than this on the demo model; only an abort frees the slot so soon.
    stack.wait_until(idle, timeout_s=8, what="the abandoned job to be aborted")
