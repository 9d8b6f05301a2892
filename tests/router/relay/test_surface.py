"""ChatRelay and CompletionRelay over the OpenAI surface: n > 1, log probabilities, tool calls, usage.

A job's last chunk is the one with `usage` (or an error); a `finish_reason` alone ends one choice.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

import msgspec
import pytest

from router.intake.tools import ToolPlan
from router.openai.common import LOWEST_LOGPROB
from router.openai.errors import EngineError, InvalidRequestError
from router.relay.chat import ChatRelay
from router.relay.completions import CompletionRelay, completion_logprobs
from router.relay.sse import SSE_DONE
from switchboard.wire import Chunk, JobError, TokenLogprob, ToolCall, TopLogprob, Usage

USAGE = Usage(prompt_tokens=5, completion_tokens=7)
TOTALS = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}


async def feed(chunks: Iterable[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


def payloads(events: list[bytes]) -> list[dict[str, Any]]:
    """Every event's JSON, checking the SSE framing and the final [DONE]."""
    assert events[-1] == SSE_DONE
    out = []
    for event in events[:-1]:
        assert event.startswith(b"data: ") and event.endswith(b"\n\n")
        out.append(json.loads(event[len(b"data: ") : -2]))
    return out


async def streamed(relay: ChatRelay | CompletionRelay, chunks: Iterable[Chunk]) -> list[dict[str, Any]]:
    return payloads([event async for event in relay.events(feed(chunks))])


def as_json(struct: msgspec.Struct) -> Any:
    return json.loads(msgspec.json.encode(struct))


def chat_relay(**options: Any) -> ChatRelay:
    return ChatRelay(job_id="j1", model="m", created=1700000000, **options)


def only_choice(event: dict[str, Any]) -> dict[str, Any]:
    assert len(event["choices"]) == 1
    choice: dict[str, Any] = event["choices"][0]
    return choice


# --- chat: several choices ------------------------------------------------------------------------

INTERLEAVED = [
    Chunk(text="Hel", index=0),
    Chunk(text="Bon", index=1),
    Chunk(text="lo", index=0, finish_reason="stop"),
    Chunk(text="jour", index=1),
    Chunk(text="!", index=1, finish_reason="length", usage=USAGE),
]


async def test_each_choice_starts_with_the_role_once() -> None:
    events = await streamed(chat_relay(n=2), INTERLEAVED)
    choices = [only_choice(event) for event in events]
    assert [(c["index"], c["delta"], c["finish_reason"]) for c in choices] == [
        (0, {"role": "assistant", "content": "Hel"}, None),
        (1, {"role": "assistant", "content": "Bon"}, None),
        (0, {"content": "lo"}, "stop"),
        (1, {"content": "jour"}, None),
        (1, {"content": "!"}, "length"),
    ]
    assert all(event["id"] == "chatcmpl-j1" for event in events)


async def test_usage_comes_once_after_the_jobs_last_chunk() -> None:
    events = await streamed(chat_relay(n=2, include_usage=True), INTERLEAVED)
    assert len(events) == 6
    # A finished choice (index 0, third event) does not end the stream.
    assert [event["usage"] for event in events[:-1]] == [None] * 5
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == TOTALS


async def test_no_usage_key_without_include_usage() -> None:
    events = await streamed(chat_relay(n=2), INTERLEAVED)
    assert all("usage" not in event for event in events)


async def test_assembled_choices_by_index() -> None:
    chunks = [
        Chunk(text="b", index=2),
        Chunk(text="a", index=0),
        Chunk(text="c", index=1, finish_reason="stop"),
        Chunk(text="a", index=0, finish_reason="length"),
        Chunk(text="b", index=2, finish_reason="stop", usage=USAGE),
    ]
    completion = await chat_relay(n=3).assemble(feed(chunks))
    data = as_json(completion)
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in data["choices"]] == [
        (0, "aa", "length"),
        (1, "c", "stop"),
        (2, "bb", "stop"),
    ]
    assert data["usage"] == TOTALS
    assert all(c["message"]["role"] == "assistant" for c in data["choices"])


async def test_assembled_error_is_raised() -> None:
    chunks = [
        Chunk(text="a", index=0, finish_reason="stop"),
        Chunk(error=JobError(code="invalid_request", message="too long", param="messages", client_code="x")),
    ]
    with pytest.raises(InvalidRequestError) as caught:
        await chat_relay(n=2).assemble(feed(chunks))
    assert (caught.value.param, caught.value.code) == ("messages", "x")


async def test_streamed_error_ends_the_stream_without_usage() -> None:
    chunks = [Chunk(text="a"), Chunk(error=JobError(code="engine_error", message="boom")), Chunk(text="b")]
    events = await streamed(chat_relay(include_usage=True), chunks)
    assert len(events) == 2
    assert events[1]["error"]["code"] == "engine_error"


# --- chat: log probabilities ----------------------------------------------------------------------

ACCENT = TokenLogprob(token="é", logprob=-0.25, top=(TopLogprob("é", -0.25), TopLogprob("e", -1.5)))


async def test_streamed_logprobs_in_the_chat_shape() -> None:
    chunks = [
        Chunk(text="é", logprobs=(ACCENT,)),
        Chunk(
            text=" x", logprobs=(TokenLogprob(token=" x", logprob=None),), finish_reason="stop", usage=USAGE
        ),
    ]
    events = await streamed(chat_relay(logprobs=True), chunks)
    assert only_choice(events[0])["logprobs"] == {
        "content": [
            {
                "token": "é",
                "logprob": -0.25,
                "bytes": [0xC3, 0xA9],
                "top_logprobs": [
                    {"token": "é", "logprob": -0.25, "bytes": [0xC3, 0xA9]},
                    {"token": "e", "logprob": -1.5, "bytes": [0x65]},
                ],
            }
        ],
        "refusal": None,
    }
    # A position without a log probability cannot be null in the chat API.
    assert only_choice(events[1])["logprobs"]["content"] == [
        {"token": " x", "logprob": LOWEST_LOGPROB, "bytes": [0x20, 0x78], "top_logprobs": []}
    ]


async def test_logprobs_only_when_asked() -> None:
    chunks = [Chunk(text="é", logprobs=(ACCENT,), finish_reason="stop", usage=USAGE)]
    events = await streamed(chat_relay(), chunks)
    assert only_choice(events[0])["logprobs"] is None
    completion = await chat_relay().assemble(feed(chunks))
    assert completion.choices[0].logprobs is None


async def test_assembled_logprobs_per_choice() -> None:
    second = TokenLogprob(token="b", logprob=-2.0)
    chunks = [
        Chunk(text="é", index=1, logprobs=(ACCENT,)),
        Chunk(text="b", index=0, logprobs=(second,), finish_reason="stop"),
        Chunk(text="b", index=1, logprobs=(second,), finish_reason="stop", usage=USAGE),
    ]
    data = as_json(await chat_relay(n=2, logprobs=True).assemble(feed(chunks)))
    tokens = [[entry["token"] for entry in c["logprobs"]["content"]] for c in data["choices"]]
    assert tokens == [["b"], ["é", "b"]]
    assert data["choices"][1]["logprobs"]["content"][0]["top_logprobs"][1]["token"] == "e"


# --- chat: a named tool choice --------------------------------------------------------------------

NAMED = ToolPlan(mode="named", function="get_weather")


async def test_named_choice_streams_tool_call_deltas() -> None:
    chunks = [
        Chunk(text='{"ci'),
        Chunk(text='ty": "Oslo'),
        Chunk(text='"}', finish_reason="stop", usage=USAGE),
    ]
    events = await streamed(chat_relay(tools=NAMED), chunks)
    deltas = [only_choice(event)["delta"] for event in events]
    first = deltas[0]
    assert first["role"] == "assistant"
    assert "content" not in first
    (call,) = first["tool_calls"]
    assert call["index"] == 0
    assert call["id"].startswith("call_")
    assert call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"ci'}
    for later in deltas[1:]:
        assert set(later) == {"tool_calls"}
        (piece,) = later["tool_calls"]
        assert set(piece) == {"index", "function"}
        assert "name" not in piece["function"]
    arguments = "".join(d["tool_calls"][0]["function"].get("arguments", "") for d in deltas)
    assert json.loads(arguments) == {"city": "Oslo"}
    assert only_choice(events[-1])["finish_reason"] == "stop"


async def test_named_choice_each_choice_has_its_own_call() -> None:
    chunks = [
        Chunk(text="{}", index=0),
        Chunk(text="{}", index=1),
        Chunk(index=0, finish_reason="stop"),
        Chunk(index=1, finish_reason="stop", usage=USAGE),
    ]
    events = await streamed(chat_relay(n=2, tools=NAMED), chunks)
    firsts = [only_choice(event) for event in events[:2]]
    assert [choice["index"] for choice in firsts] == [0, 1]
    ids = [choice["delta"]["tool_calls"][0]["id"] for choice in firsts]
    assert ids[0] != ids[1]
    assert all(choice["delta"]["tool_calls"][0]["function"]["name"] == "get_weather" for choice in firsts)
    # The finishing chunks add no arguments: they carry the finish reason alone.
    finishing = [only_choice(event) for event in events[2:]]
    assert [choice["finish_reason"] for choice in finishing] == ["stop", "stop"]
    assert all("tool_calls" not in choice["delta"] for choice in finishing)


async def test_named_choice_assembled() -> None:
    chunks = [Chunk(text='{"city": '), Chunk(text='"Oslo"}', finish_reason="stop", usage=USAGE)]
    data = as_json(await chat_relay(tools=NAMED).assemble(feed(chunks)))
    (choice,) = data["choices"]
    message = choice["message"]
    assert message["content"] is None
    (call,) = message["tool_calls"]
    assert call["type"] == "function"
    assert call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}


# --- chat: a required tool choice -----------------------------------------------------------------

REQUIRED = ToolPlan(mode="required")
TWO_CALLS = [
    '[{"name": "get_weather", "parameters": {"city": "Oslo"}}',
    ', {"name": "get_time", "parameters": {}}]',
]


async def test_required_choice_is_held_until_it_finishes() -> None:
    chunks = [Chunk(text=TWO_CALLS[0]), Chunk(text=TWO_CALLS[1], finish_reason="stop", usage=USAGE)]
    events = await streamed(chat_relay(tools=REQUIRED, include_usage=True), chunks)
    assert len(events) == 3
    # Nothing of the held text leaks before the end: the first event only opens the message.
    assert only_choice(events[0])["delta"] == {"role": "assistant"}
    assert only_choice(events[0])["finish_reason"] is None
    final = only_choice(events[1])
    assert final["finish_reason"] == "tool_calls"
    assert "content" not in final["delta"]
    calls = final["delta"]["tool_calls"]
    assert [call["index"] for call in calls] == [0, 1]
    assert [call["function"]["name"] for call in calls] == ["get_weather", "get_time"]
    assert [json.loads(call["function"]["arguments"]) for call in calls] == [{"city": "Oslo"}, {}]
    assert all(call["type"] == "function" and call["id"].startswith("call_") for call in calls)
    assert calls[0]["id"] != calls[1]["id"]
    assert events[2]["usage"] == TOTALS


async def test_a_resumed_required_choice_still_parses_the_text_held_before_the_break() -> None:
    """The client's stream broke after the first chunk (held, so it saw only the role)."""
    relay = chat_relay(tools=REQUIRED)
    relay.replay([Chunk(text=TWO_CALLS[0])])
    events = await streamed(relay, [Chunk(text=TWO_CALLS[1], finish_reason="stop", usage=USAGE)])
    final = only_choice(events[0])
    assert "role" not in final["delta"], "the client had the role already"
    assert final["finish_reason"] == "tool_calls"
    assert [call["function"]["name"] for call in final["delta"]["tool_calls"]] == ["get_weather", "get_time"]


async def test_required_choice_cut_short_falls_back_to_text() -> None:
    chunks = [
        Chunk(text='[{"name": "get_wea'),
        Chunk(text='ther", "par', finish_reason="length", usage=USAGE),
    ]
    events = await streamed(chat_relay(tools=REQUIRED), chunks)
    final = only_choice(events[-1])
    assert final["delta"] == {"content": '[{"name": "get_weather", "par'}
    assert final["finish_reason"] == "length"


async def test_required_choices_are_held_each_on_its_own() -> None:
    chunks = [
        Chunk(text='[{"name": "get_time", ', index=0),
        Chunk(text="I will not", index=1),
        Chunk(text='"parameters": {}}]', index=0, finish_reason="stop"),
        Chunk(text=" call it.", index=1, finish_reason="stop", usage=USAGE),
    ]
    events = await streamed(chat_relay(n=2, tools=REQUIRED), chunks)
    finals = [only_choice(event) for event in events if only_choice(event)["finish_reason"] is not None]
    assert [(choice["index"], choice["finish_reason"]) for choice in finals] == [
        (0, "tool_calls"),
        (1, "stop"),
    ]
    assert finals[0]["delta"]["tool_calls"][0]["function"]["name"] == "get_time"
    assert finals[1]["delta"] == {"content": "I will not call it."}


async def test_required_choice_assembled() -> None:
    chunks = [Chunk(text=TWO_CALLS[0]), Chunk(text=TWO_CALLS[1], finish_reason="stop", usage=USAGE)]
    data = as_json(await chat_relay(tools=REQUIRED).assemble(feed(chunks)))
    (choice,) = data["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    calls = choice["message"]["tool_calls"]
    assert [(call["function"]["name"], json.loads(call["function"]["arguments"])) for call in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_time", {}),
    ]


async def test_required_choice_assembled_falls_back_to_text() -> None:
    chunks = [Chunk(text="[{", finish_reason="length", usage=USAGE)]
    data = as_json(await chat_relay(tools=REQUIRED).assemble(feed(chunks)))
    (choice,) = data["choices"]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("[{", "length")
    assert "tool_calls" not in choice["message"]


# --- chat: calls parsed by the worker (auto) ------------------------------------------------------

PARSED = (ToolCall(id="call_x1", name="get_time", arguments="{}"),)


async def test_parsed_calls_are_streamed_whole() -> None:
    chunks = [Chunk(text="Let me check.", tool_calls=PARSED, finish_reason="stop", usage=USAGE)]
    events = await streamed(chat_relay(tools=ToolPlan(mode="auto")), chunks)
    choice = only_choice(events[0])
    assert choice["finish_reason"] == "tool_calls"
    assert choice["delta"] == {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {
                "index": 0,
                "id": "call_x1",
                "type": "function",
                "function": {"name": "get_time", "arguments": "{}"},
            }
        ],
    }


async def test_parsed_calls_assembled() -> None:
    chunks = [Chunk(text="a"), Chunk(tool_calls=PARSED, finish_reason="stop", usage=USAGE)]
    data = as_json(await chat_relay(tools=ToolPlan(mode="auto")).assemble(feed(chunks)))
    (choice,) = data["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "a"
    assert choice["message"]["tool_calls"] == [
        {"id": "call_x1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    ]


# --- completions ----------------------------------------------------------------------------------


def completion_relay(choices: int = 1, **options: Any) -> CompletionRelay:
    settings = {"include_usage": False, "logprobs": False, **options}
    return CompletionRelay(job_id="j2", model="m", created=1700000000, choices=choices, **settings)


def token(text: str, logprob: float | None = -1.0) -> TokenLogprob:
    top = () if logprob is None else (TopLogprob(text, logprob), TopLogprob("?", -3.0))
    return TokenLogprob(token=text, logprob=logprob, top=top)


async def test_text_offsets_continue_per_choice() -> None:
    chunks = [
        Chunk(text="Hello", index=0, logprobs=(token("Hel"), token("lo"))),
        Chunk(text="Yes", index=1, logprobs=(token("Yes"),)),
        Chunk(text=" big world", index=0, logprobs=(token(" big"), token(" world"))),
        Chunk(text=", sir", index=1, logprobs=(token(","), token(" sir")), finish_reason="stop"),
        Chunk(text="!", index=0, logprobs=(token("!"),), finish_reason="stop", usage=USAGE),
    ]
    events = await streamed(completion_relay(2, logprobs=True), chunks)
    offsets = [(only_choice(e)["index"], only_choice(e)["logprobs"]["text_offset"]) for e in events]
    assert offsets == [(0, [0, 3]), (1, [0]), (0, [5, 9]), (1, [3, 4]), (0, [15])]
    assembled = await completion_relay(2, logprobs=True).assemble(feed(chunks))
    assert [choice.logprobs.text_offset for choice in assembled.choices if choice.logprobs] == [
        [0, 3, 5, 9, 15],
        [0, 3, 4],
    ]
    # A client that resumes after the second chunk gets the same offsets for the rest.
    resumed = completion_relay(2, logprobs=True)
    resumed.replay(chunks[:2])
    events = await streamed(resumed, chunks[2:])
    assert [(only_choice(e)["index"], only_choice(e)["logprobs"]["text_offset"]) for e in events] == offsets[
        2:
    ]


async def test_an_echoed_first_token_has_no_alternatives() -> None:
    chunks = [
        Chunk(text="Hi there", logprobs=(token("Hi", None), token(" there", -0.5))),
        Chunk(text="!", logprobs=(token("!", -0.1),), finish_reason="length", usage=USAGE),
    ]
    events = await streamed(completion_relay(logprobs=True), chunks)
    assert only_choice(events[0])["logprobs"] == {
        "tokens": ["Hi", " there"],
        "token_logprobs": [None, -0.5],
        "top_logprobs": [None, {" there": -0.5, "?": -3.0}],
        "text_offset": [0, 2],
    }
    assert only_choice(events[1])["logprobs"]["text_offset"] == [8]


def test_completion_logprobs_columns() -> None:
    columns = completion_logprobs([token("ab", None), token("cde", -0.2), token("f", -1.0)], 10)
    assert columns.tokens == ["ab", "cde", "f"]
    assert columns.token_logprobs == [None, -0.2, -1.0]
    assert columns.top_logprobs == [None, {"cde": -0.2, "?": -3.0}, {"f": -1.0, "?": -3.0}]
    assert columns.text_offset == [10, 12, 15]


async def test_completion_events_and_usage() -> None:
    chunks = [
        Chunk(text="a", index=1),
        Chunk(text="b", index=0, finish_reason="stop"),
        Chunk(index=1, finish_reason="stop", usage=USAGE),
    ]
    events = await streamed(completion_relay(2, include_usage=True), chunks)
    assert len(events) == 4
    for event in events:
        assert (event["id"], event["object"], event["model"], event["created"]) == (
            "cmpl-j2",
            "text_completion",
            "m",
            1700000000,
        )
    assert [
        (c["index"], c["text"], c["finish_reason"], c["logprobs"]) for c in map(only_choice, events[:3])
    ] == [
        (1, "a", None, None),
        (0, "b", "stop", None),
        (1, "", "stop", None),
    ]
    assert [event["usage"] for event in events[:3]] == [None, None, None]
    assert events[3]["choices"] == []
    assert events[3]["usage"] == TOTALS


async def test_completion_without_include_usage_has_no_usage_key() -> None:
    events = await streamed(completion_relay(), [Chunk(text="a", finish_reason="stop", usage=USAGE)])
    assert len(events) == 1
    assert "usage" not in events[0]


async def test_completion_assembled_by_index() -> None:
    # Two prompts, n=2: choice 2 * prompt + j.
    chunks = [
        Chunk(text="p1c0", index=2),
        Chunk(text="p0c1", index=1, finish_reason="stop"),
        Chunk(text="p0c0", index=0, finish_reason="length"),
        Chunk(text="p1c1", index=3, finish_reason="stop"),
        Chunk(text="!", index=2, finish_reason="stop", usage=USAGE),
    ]
    data = as_json(await completion_relay(4).assemble(feed(chunks)))
    assert [(c["index"], c["text"], c["finish_reason"]) for c in data["choices"]] == [
        (0, "p0c0", "length"),
        (1, "p0c1", "stop"),
        (2, "p1c0!", "stop"),
        (3, "p1c1", "stop"),
    ]
    assert data["usage"] == TOTALS
    assert (data["id"], data["object"]) == ("cmpl-j2", "text_completion")


async def test_completion_error() -> None:
    chunks = [Chunk(text="a"), Chunk(error=JobError(code="engine_error", message="boom"))]
    events = await streamed(completion_relay(include_usage=True), chunks)
    assert len(events) == 2
    assert events[1]["error"]["code"] == "engine_error"
    with pytest.raises(EngineError):
        await completion_relay().assemble(feed(chunks))
