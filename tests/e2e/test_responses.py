"""OpenAI Responses (`/v1/responses`) through every real part, with the official `openai` client.

A response is the chat job's answer in another shape: the same greedy text and token counts as the
chat completion of the same conversation, its items and stream events in OpenAI's order, function
calls as `function_call` items, and what needs a stored response refused with a 400 that says so.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel, Field

from tests.e2e.test_openai_surface import OSLO_CALL, TIME_TOOL, WEATHER_TOOL
from tests.support.stack import MODEL, PIPELINE, Stack

pytestmark = pytest.mark.e2e

PROMPT = "Tell me a story about the sea."
INSTRUCTIONS = "You answer briefly."
MAX_TOKENS = 12
# The chat surface's tools, in the Responses shape (the function's fields beside its `type`).
WEATHER_FUNCTION: dict[str, Any] = {"type": "function", **WEATHER_TOOL["function"]}
TIME_FUNCTION: dict[str, Any] = {"type": "function", **TIME_TOOL["function"]}


def chat_answer(client: OpenAI, messages: list[dict[str, Any]], max_tokens: int = MAX_TOKENS) -> Any:
    return client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0
    )  # type: ignore[arg-type]


def test_a_response_is_the_chat_answer_with_its_usage_and_id(client: OpenAI) -> None:
    reference = chat_answer(
        client, [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": PROMPT}]
    )
    response = client.responses.create(
        model=MODEL, instructions=INSTRUCTIONS, input=PROMPT, max_output_tokens=MAX_TOKENS, temperature=0
    )
    assert response.output_text == reference.choices[0].message.content
    assert response.usage is not None and reference.usage is not None
    assert response.usage.input_tokens == reference.usage.prompt_tokens
    assert response.usage.output_tokens == reference.usage.completion_tokens
    assert response.usage.total_tokens == reference.usage.total_tokens
    assert response.id == f"resp_{response._request_id}", "the response's id is the job's"
    assert response.model == MODEL and response.object == "response" and response.store is False
    assert response.instructions == INSTRUCTIONS and response.max_output_tokens == MAX_TOKENS
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    if reference.choices[0].finish_reason == "length":
        assert response.status == "incomplete" and message.status == "incomplete"
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
    else:
        assert response.status == "completed" and response.incomplete_details is None


def test_message_items_and_parts_are_the_conversation(client: OpenAI) -> None:
    conversation = [
        {"role": "user", "content": "Hello."},
        {"role": "assistant", "content": "Hi. How can I help?"},
        {"role": "user", "content": PROMPT},
    ]
    reference = chat_answer(client, conversation)
    items: Any = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello."}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hi. How can I help?"}]},
        {"role": "user", "content": PROMPT},
    ]
    response = client.responses.create(model=MODEL, input=items, max_output_tokens=MAX_TOKENS, temperature=0)
    assert response.output_text == reference.choices[0].message.content
    assert response.usage is not None and response.usage.input_tokens == reference.usage.prompt_tokens


def test_a_stream_has_openais_events_in_order_and_the_same_text(client: OpenAI) -> None:
    whole = client.responses.create(model=MODEL, input=PROMPT, max_output_tokens=MAX_TOKENS, temperature=0)
    events = list(
        client.responses.create(
            model=MODEL, input=PROMPT, max_output_tokens=MAX_TOKENS, temperature=0, stream=True
        )
    )
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        f"response.{whole.status}",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == whole.output_text
    last: Any = events[-1]
    assert last.response.output_text == whole.output_text
    assert last.response.usage.output_tokens == whole.usage.output_tokens  # type: ignore[union-attr]
    item_ids = {event.item_id for event in events if hasattr(event, "item_id")}
    assert item_ids == {last.response.output[0].id}


def test_the_sdks_stream_helper_builds_the_final_response(client: OpenAI) -> None:
    # vLLM's extensions pass through as on chat: three digits end the answer before its length does.
    digits = {"structured_outputs": {"regex": "[0-9]{3}"}, "seed": 7}
    with client.responses.stream(
        model=MODEL, input=PROMPT, max_output_tokens=10, extra_body=digits
    ) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed" and len(final.output_text) == 3 and final.output_text.isdigit()
    assert final.output_text == "".join(deltas)


def test_the_stream_is_framed_as_openais_with_event_lines_and_no_done(stack: Stack) -> None:
    body = {"model": MODEL, "input": PROMPT, "max_output_tokens": 4, "stream": True}
    reply = httpx.post(f"{stack.base_url}/v1/responses", json=body, timeout=120)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    blocks = [block for block in reply.text.split("\n\n") if block.strip()]
    for block in blocks:
        event_line, data_line = block.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        assert json.loads(data_line.removeprefix("data: "))["type"] == event_line.removeprefix("event: ")
    assert "[DONE]" not in reply.text


def test_a_named_function_is_a_function_call_item(client: OpenAI) -> None:
    response = client.responses.create(
        model=MODEL,
        input="What is the weather in Oslo?",
        tools=[WEATHER_FUNCTION, TIME_FUNCTION],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=60,
        temperature=1.0,
        extra_body={"seed": 5},
    )
    (call,) = response.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert set(json.loads(call.arguments)) == {"city", "days"}
    assert response.output_text == ""


def test_a_streamed_function_call_reassembles(client: OpenAI) -> None:
    events = list(
        client.responses.create(
            model=MODEL,
            input="What is the weather in Oslo?",
            tools=[WEATHER_FUNCTION],  # type: ignore[list-item]
            tool_choice={"type": "function", "name": "get_weather"},
            max_output_tokens=60,
            temperature=1.0,
            stream=True,
            extra_body={"seed": 5},
        )
    )
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done.arguments == deltas and set(json.loads(deltas)) == {"city", "days"}
    final: Any = events[-1]
    assert final.type == "response.completed"
    assert final.response.output[0].type == "function_call" and final.response.output[0].arguments == deltas


def test_auto_calls_in_the_models_syntax_come_back_as_items(client: OpenAI) -> None:
    # A random model never writes a call by itself: vLLM's regex constraint makes it write one.
    response = client.responses.create(
        model=MODEL,
        input="Weather in Oslo?",
        tools=[WEATHER_FUNCTION, TIME_FUNCTION],  # type: ignore[list-item]
        max_output_tokens=40,
        extra_body={"structured_outputs": {"regex": OSLO_CALL}},
    )
    calls = [item for item in response.output if item.type == "function_call"]
    (call,) = calls
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Oslo", "days": 2}


def test_a_function_calls_output_goes_back_as_items(client: OpenAI) -> None:
    conversation: Any = [
        {"role": "user", "content": "What is the weather in Oslo?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city":"Oslo","days":1}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C."},
    ]
    reference = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": "What is the weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Oslo","days":1}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C."},
        ],
        tools=[WEATHER_TOOL],
        tool_choice="none",
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    response = client.responses.create(
        model=MODEL,
        input=conversation,
        tools=[WEATHER_FUNCTION],  # type: ignore[list-item]
        tool_choice="none",
        max_output_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert response.output_text == reference.choices[0].message.content
    assert response.usage is not None and reference.usage is not None
    assert response.usage.input_tokens == reference.usage.prompt_tokens


def test_a_json_schema_format_answers_json_of_the_schema(client: OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,10}$"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    response = client.responses.create(
        model=MODEL,
        input=PROMPT,
        max_output_tokens=60,
        temperature=1.0,
        text={"format": {"type": "json_schema", "name": "person", "schema": schema}},
        extra_body={"seed": 11},
    )
    assert set(json.loads(response.output_text)) == {"name", "age"}


class Person(BaseModel):
    """The short pattern lets even the demo model's random weights finish it within a few tokens."""

    name: str = Field(pattern="^[a-z]{1,10}$")
    age: int


def test_the_sdks_parse_gives_the_pydantic_model(client: OpenAI) -> None:
    response = client.responses.parse(
        model=MODEL,
        input="Who are you? Answer in JSON.",
        text_format=Person,
        max_output_tokens=60,
        temperature=1.0,
        extra_body={"seed": 11},
    )
    assert isinstance(response.output_parsed, Person)
    assert response.output_parsed.model_dump() == json.loads(response.output_text)


def test_logprobs_come_with_the_text_when_included(client: OpenAI) -> None:
    response = client.responses.create(
        model=MODEL,
        input=PROMPT,
        max_output_tokens=5,
        temperature=0,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    (part,) = response.output[0].content  # type: ignore[union-attr]
    assert part.type == "output_text" and part.logprobs is not None
    assert "".join(entry.token for entry in part.logprobs) == part.text
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in part.logprobs)


@pytest.mark.parametrize(
    ("options", "param", "says"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id", "not stored"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "not stored"),
        (
            {
                "input": [
                    {"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}
                ]
            },
            "input[0].content[0].image_url",
            "not fetched here",
        ),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "hosted tools"),
        ({"background": True}, "background", "not supported"),
        ({"truncation": "auto"}, "truncation", "shorten"),
        ({"include": ["no.such.thing"]}, "include[0]", "Unknown"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments", "needs"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema", "schema"),
        # Found on the chat request that answers it, said in the Responses request's words.
        ({"max_output_tokens": 1_000_000}, "max_output_tokens", "max_output_tokens"),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_it(
    client: OpenAI, options: dict[str, Any], param: str, says: str
) -> None:
    request: dict[str, Any] = {"model": MODEL, "input": PROMPT, "max_output_tokens": 4, **options}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(**request)
    assert caught.value.status_code == 400
    error: Any = caught.value.body
    assert error["param"] == param and says in error["message"], error


def test_an_unknown_model_is_a_404(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input=PROMPT)


def test_a_response_cannot_be_read_back_nothing_is_stored(client: OpenAI) -> None:
    response = client.responses.create(model=MODEL, input=PROMPT, max_output_tokens=2)
    for read_back in (client.responses.retrieve, client.responses.delete, client.responses.input_items.list):
        with pytest.raises(openai.NotFoundError) as caught:
            read_back(response.id)
        error: Any = caught.value.body
        assert error["code"] == "response_not_found" and response.id in error["message"], error
        assert "not stored" in error["message"]


def test_a_pipeline_answers_a_response_with_its_next_step_when_the_first_cannot_load(client: OpenAI) -> None:
    reply = client.responses.with_raw_response.create(
        model=PIPELINE, input=PROMPT, max_output_tokens=8, temperature=0
    )
    assert reply.headers["x-switchboard-pipeline"] == PIPELINE
    assert reply.headers["x-switchboard-model"] == MODEL
    response = reply.parse()
    assert response.model == MODEL and response.output_text
    events = list(
        client.responses.create(model=PIPELINE, input=PROMPT, max_output_tokens=8, temperature=0, stream=True)
    )
    final: Any = events[-1]
    assert final.response.model == MODEL and final.response.output_text == response.output_text
