"""ChatRelay: result chunks → OpenAI server-sent events or one assembled completion."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

import msgspec
import pytest

from router.openai.errors import (
    EngineError,
    InvalidRequestError,
    JobTimeoutError,
    ModelLoadFailedError,
    OpenAIError,
    ServiceUnavailableError,
)
from router.relay.chat import ChatRelay
from router.relay.sse import SSE_DONE, sse_comment
from switchboard.wire import Chunk, JobError, Usage

DONE = b"data: [DONE]\n\n"


async def feed(chunks: Iterable[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


def relay(include_usage: bool = False) -> ChatRelay:
    return ChatRelay(job_id="job1", model="m", created=1700000000, include_usage=include_usage)


async def collect(r: ChatRelay, chunks: Iterable[Chunk]) -> list[bytes]:
    return [event async for event in r.events(feed(chunks))]


def payloads(events: list[bytes]) -> list[dict[str, Any]]:
    """The JSON of every event but the final [DONE], checking the SSE framing on the way."""
    assert events, "no events"
    assert events[-1] == DONE
    out = []
    for event in events[:-1]:
        assert event.startswith(b"data: ")
        assert event.endswith(b"\n\n")
        assert event.count(b"\n\n") == 1
        out.append(msgspec.json.decode(event[len(b"data: ") : -2]))
    return out


STREAM = [
    Chunk(text="Hel"),
    Chunk(text="lo"),
    Chunk(text=" world", finish_reason="stop", usage=Usage(prompt_tokens=4, completion_tokens=3)),
]


def test_done_constant() -> None:
    assert SSE_DONE == DONE


async def test_events_shape() -> None:
    events = payloads(await collect(relay(), STREAM))
    assert len(events) == 3
    for event in events:
        assert event["id"] == "chatcmpl-job1"
        assert event["object"] == "chat.completion.chunk"
        assert event["model"] == "m"
        assert event["created"] == 1700000000
        assert len(event["choices"]) == 1
        assert event["choices"][0]["index"] == 0
        assert "usage" not in event
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": "Hel"}
    assert events[1]["choices"][0]["delta"] == {"content": "lo"}
    assert events[2]["choices"][0]["delta"] == {"content": " world"}
    assert [e["choices"][0]["finish_reason"] for e in events] == [None, None, "stop"]


async def test_finish_without_text_after_content() -> None:
    chunks = [
        Chunk(text="a"),
        Chunk(finish_reason="length", usage=Usage(prompt_tokens=1, completion_tokens=1)),
    ]
    events = payloads(await collect(relay(), chunks))
    assert len(events) == 2
    assert events[1]["choices"][0]["delta"] == {}
    assert events[1]["choices"][0]["finish_reason"] == "length"


async def test_first_chunk_only_a_finish_still_has_role() -> None:
    events = payloads(await collect(relay(), [Chunk(finish_reason="stop")]))
    assert len(events) == 1
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[0]["choices"][0]["finish_reason"] == "stop"


async def test_empty_chunks_produce_no_event() -> None:
    chunks = [Chunk(), Chunk(text="x"), Chunk(), Chunk(finish_reason="stop")]
    events = payloads(await collect(relay(), chunks))
    assert len(events) == 2
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": "x"}


async def test_empty_stream_is_just_done() -> None:
    assert await collect(relay(), []) == [DONE]


async def test_include_usage() -> None:
    events = payloads(await collect(relay(include_usage=True), STREAM))
    assert len(events) == 4
    for event in events[:3]:
        assert "usage" in event
        assert event["usage"] is None
        assert len(event["choices"]) == 1
    final = events[-1]
    assert final["choices"] == []
    assert final["id"] == "chatcmpl-job1"
    assert final["object"] == "chat.completion.chunk"
    assert final["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}


async def test_error_chunk_yields_error_event_then_done() -> None:
    chunks = [
        Chunk(text="partial"),
        Chunk(error=JobError(code="engine_error", message="boom")),
        Chunk(text="never"),
    ]
    events = payloads(await collect(relay(include_usage=True), chunks))
    assert len(events) == 2
    assert events[0]["choices"][0]["delta"]["content"] == "partial"
    assert events[1] == {
        "error": {"message": "boom", "type": "internal_error", "param": None, "code": "engine_error"}
    }


@pytest.mark.parametrize(
    ("code", "type_", "error_code"),
    [
        ("invalid_request", "invalid_request_error", None),
        ("timeout", "timeout", "timeout"),
        ("engine_error", "internal_error", "engine_error"),
    ],
)
async def test_error_event_kinds(code: Any, type_: str, error_code: str | None) -> None:
    events = payloads(await collect(relay(), [Chunk(error=JobError(code=code, message="why"))]))
    assert events == [{"error": {"message": "why", "type": type_, "param": None, "code": error_code}}]


def test_error_event_helper() -> None:
    event = relay().error_event(ServiceUnavailableError("busy"))
    assert event.endswith(DONE)
    head = event[: -len(DONE)]
    assert head.startswith(b"data: ") and head.endswith(b"\n\n")
    assert msgspec.json.decode(head[6:-2]) == {
        "error": {
            "message": "busy",
            "type": "service_unavailable",
            "param": None,
            "code": "service_unavailable",
        }
    }


async def test_assemble() -> None:
    completion = await relay().assemble(feed(STREAM))
    data = msgspec.json.decode(msgspec.json.encode(completion))
    assert data["id"] == "chatcmpl-job1"
    assert data["object"] == "chat.completion"
    assert data["model"] == "m"
    assert data["created"] == 1700000000
    assert data["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello world", "refusal": None},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ]
    assert data["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}


async def test_assemble_without_usage_reports_zeros() -> None:
    completion = await relay().assemble(feed([Chunk(text="a"), Chunk(text="b", finish_reason="length")]))
    assert completion.choices[0].message.content == "ab"
    assert completion.choices[0].finish_reason == "length"
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (0, 0)
    assert completion.usage.total_tokens == 0


@pytest.mark.parametrize(
    ("code", "cls", "status"),
    [
        ("invalid_request", InvalidRequestError, 400),
        ("timeout", JobTimeoutError, 504),
        ("engine_error", EngineError, 500),
    ],
)
async def test_assemble_raises_job_error(code: Any, cls: type[OpenAIError], status: int) -> None:
    chunks = [Chunk(text="x"), Chunk(error=JobError(code=code, message="went wrong"))]
    with pytest.raises(cls) as info:
        await relay().assemble(feed(chunks))
    assert info.value.status_code == status
    assert info.value.message == "went wrong"


async def test_a_failed_load_is_a_503_naming_the_model() -> None:
    error = JobError(code="load_failed", message="weights not found", retry_after_s=14.5)
    events = payloads(await collect(relay(), [Chunk(error=error)]))
    assert events == [
        {
            "error": {
                "message": "Model `m` failed to load: weights not found. Retrying in 15 s.",
                "type": "service_unavailable",
                "param": None,
                "code": "model_load_failed",
            }
        }
    ]
    with pytest.raises(ModelLoadFailedError) as info:
        await relay().assemble(feed([Chunk(error=error)]))
    assert info.value.headers == {"Retry-After": "15"}


def test_sse_comment_is_one_comment_line() -> None:
    assert sse_comment("loading m,\n12 s") == b": loading m, 12 s\n\n"
