"""ResponsesRelay: result chunks → a response's typed events, or one response object."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

import msgspec
import pytest

from router.intake.tools import TEXT, ToolPlan
from router.openai.errors import EngineError
from router.openai.responses import OutputFunctionCall, OutputMessage, ResponsesRequest
from router.relay.responses import ResponsesRelay, responses_relay
from router.relay.sse import ends_stream
from switchboard.wire import Chunk, Job, JobError, SamplingParams, TokenLogprob, ToolCall, TopLogprob, Usage

USAGE = Usage(prompt_tokens=4, completion_tokens=3)
STREAM = [Chunk(text="Hel"), Chunk(text="lo"), Chunk(text=" world", finish_reason="stop", usage=USAGE)]


async def feed(chunks: Iterable[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


def relay(tools: ToolPlan = TEXT, logprobs: bool = False, **request: Any) -> ResponsesRelay:
    body = msgspec.convert({"model": "m", "input": "hi", **request}, ResponsesRequest)
    job = Job(id="job1", model="m", created=1700000000.0, deadline=1700000060.0, sampling=SamplingParams())
    return responses_relay(body, job, tools, model="m", logprobs=logprobs)


def events_of(frames: Iterable[bytes]) -> list[dict[str, Any]]:
    """Every event's JSON, checking its framing (an `event:` line naming its type, one `data:` line)."""
    out = []
    for frame in frames:
        event_line, data_line, *rest = frame.split(b"\n")
        assert rest == [b"", b""], frame
        event = json.loads(data_line.removeprefix(b"data: "))
        assert event_line == b"event: " + event["type"].encode()
        out.append(event)
    return out


async def streamed(r: ResponsesRelay, chunks: Iterable[Chunk]) -> list[dict[str, Any]]:
    return events_of([frame async for frame in r.events(feed(chunks))])


async def test_a_text_answer_streams_in_openais_order() -> None:
    events = await streamed(relay(), STREAM)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(11))
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert [e["delta"] for e in events[4:7]] == ["Hel", "lo", " world"]
    assert {e["item_id"] for e in events[2:10] if "item_id" in e} == {"msg_job1_0"}
    assert events[7]["text"] == "Hello world"
    final = events[-1]["response"]
    assert final["id"] == "resp_job1" and final["status"] == "completed" and final["store"] is False
    assert final["output"] == [
        {
            "type": "message",
            "id": "msg_job1_0",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hello world", "annotations": [], "logprobs": []}],
        }
    ]
    assert final["usage"]["input_tokens"] == 4 and final["usage"]["output_tokens"] == 3
    assert final["usage"]["total_tokens"] == 7


async def test_an_answer_cut_by_its_length_is_incomplete() -> None:
    chunks = [Chunk(text="a"), Chunk(text="b", finish_reason="length", usage=USAGE)]
    events = await streamed(relay(max_output_tokens=2), chunks)
    assert events[-1]["type"] == "response.incomplete"
    final = events[-1]["response"]
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete" and final["max_output_tokens"] == 2
    whole = await relay().assemble(feed(chunks))
    assert whole.status == "incomplete" and whole.output[0].status == "incomplete"


async def test_the_assembled_response_is_the_streams_last() -> None:
    events = await streamed(relay(instructions="Be brief."), STREAM)
    whole = await relay(instructions="Be brief.").assemble(feed(STREAM))
    assert msgspec.to_builtins(whole) == events[-1]["response"]
    assert whole.instructions == "Be brief."


async def test_a_named_function_streams_its_arguments() -> None:
    chunks = [Chunk(text='{"city":'), Chunk(text='"Oslo"}', finish_reason="stop", usage=USAGE)]
    events = await streamed(relay(ToolPlan(mode="named", function="get_weather")), chunks)
    kinds = [e["type"] for e in events]
    assert kinds[2:] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[2]["item"]["name"] == "get_weather" and events[2]["item"]["status"] == "in_progress"
    assert events[5]["arguments"] == '{"city":"Oslo"}' and events[5]["name"] == "get_weather"
    (call,) = events[-1]["response"]["output"]
    assert call["type"] == "function_call" and call["arguments"] == '{"city":"Oslo"}'
    assert call["call_id"] == "call_job1_0" and call["id"] == "fc_job1_0"


async def test_a_required_answer_is_held_until_whole_then_its_calls() -> None:
    text = '[{"name": "get_time", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "Oslo"}}]'
    chunks = [Chunk(text=text[:20]), Chunk(text=text[20:], finish_reason="stop", usage=USAGE)]
    events = await streamed(relay(ToolPlan(mode="required")), chunks)
    assert [e["type"] for e in events[2:4]] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
    ]
    calls = events[-1]["response"]["output"]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_time", {}),
        ("get_weather", {"city": "Oslo"}),
    ]
    assert [c["id"] for c in calls] == ["fc_job1_0", "fc_job1_1"]
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert added == [0, 1]


async def test_a_required_answer_cut_short_is_text() -> None:
    chunks = [Chunk(text='[{"name": "get_', finish_reason="length", usage=USAGE)]
    events = await streamed(relay(ToolPlan(mode="required")), chunks)
    (message,) = events[-1]["response"]["output"]
    assert message["type"] == "message" and message["content"][0]["text"] == '[{"name": "get_'


async def test_calls_parsed_by_the_worker_follow_the_text() -> None:
    call = ToolCall(id="call_w", name="get_time", arguments="{}")
    chunks = [Chunk(text="Let me look."), Chunk(tool_calls=(call,), finish_reason="stop", usage=USAGE)]
    whole = await relay(ToolPlan(mode="auto")).assemble(feed(chunks))
    message, function = whole.output
    assert isinstance(message, OutputMessage) and message.content[0].text == "Let me look."
    assert isinstance(function, OutputFunctionCall)
    assert (function.call_id, function.name, function.status) == ("call_w", "get_time", "completed")


async def test_a_failed_job_is_a_failed_response() -> None:
    chunks = [Chunk(text="Hel"), Chunk(error=JobError(code="engine_error", message="the engine died"))]
    events = await streamed(relay(), chunks)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["status"] == "failed"
    assert events[-1]["response"]["error"]["message"] == "the engine died"
    with pytest.raises(EngineError):
        await relay().assemble(feed(chunks))


def test_an_error_after_the_headers_is_a_failed_response_after_a_beginning() -> None:
    r = relay()
    events = events_of(
        frame + b"\n\n" for frame in r.error_event(EngineError("lost")).split(b"\n\n") if frame
    )
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.failed"]


def test_a_resumed_stream_goes_on_with_the_same_items_and_numbers() -> None:
    first, resumed = relay(), relay()
    had = [event for chunk in STREAM[:2] for event in first.chunk_events(chunk)]
    rest = first.chunk_events(STREAM[2])
    resumed.replay(STREAM[:2])
    assert resumed.chunk_events(STREAM[2]) == rest
    assert len(had) == 6


def test_logprobs_are_sent_with_their_text_when_asked() -> None:
    entry = TokenLogprob(token="Hi", logprob=-0.5, top=(TopLogprob(token="Hi", logprob=-0.5),))
    chunk = Chunk(text="Hi", logprobs=(entry,), finish_reason="stop", usage=USAGE)
    events = events_of(relay(logprobs=True).chunk_events(chunk))
    (delta,) = [e for e in events if e["type"] == "response.output_text.delta"]
    assert delta["logprobs"] == [
        {
            "token": "Hi",
            "logprob": -0.5,
            "bytes": [72, 105],
            "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}],
        }
    ]
    without = events_of(relay().chunk_events(chunk))
    assert [e["logprobs"] for e in without if e["type"] == "response.output_text.delta"] == [[]]


def test_the_last_write_of_a_response_stream_ends_it() -> None:
    r = relay()
    frames = [frame for chunk in STREAM for frame in r.chunk_events(chunk)]
    assert ends_stream(b"".join(frames[-3:]))
    assert not any(ends_stream(b"".join(frames[:n])) for n in range(1, len(frames)))
    assert ends_stream(b'data: {"x": 1}\n\ndata: [DONE]\n\n')


async def test_an_empty_answer_is_an_empty_message() -> None:
    whole = await relay().assemble(feed([Chunk(finish_reason="stop", usage=USAGE)]))
    (message,) = whole.output
    assert isinstance(message, OutputMessage) and message.content[0].text == ""
    events = await streamed(relay(), [Chunk(finish_reason="stop", usage=USAGE)])
    assert "response.output_text.delta" not in [e["type"] for e in events]
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == ""
