"""Chat completions through every real part: openai client → front door → Redis → worker (PyTriton + vLLM)."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from tests.support.stack import (
    BROKEN_ROUTER_PIPELINE,
    BROKEN_VERSION,
    CASCADE_PIPELINE,
    COLD_VERSION,
    MODEL,
    PIPELINE,
    ROUTE,
    ROUTER_PIPELINE,
    SECOND_VERSION,
    TRACED_VERSION,
    WARM_ROUTER_PIPELINE,
    Stack,
)

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "Tell me a story about the sea."}]


def test_non_streamed_completion_has_openai_shape_and_usage_that_adds_up(client: OpenAI) -> None:
    completion = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0)
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    assert completion.model == MODEL
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 24
    assert completion.usage.prompt_tokens > 0
    assert (
        completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    )


def test_streamed_chunks_reassemble_to_the_non_streamed_text(client: OpenAI) -> None:
    params = {"model": MODEL, "messages": MESSAGES, "max_tokens": 40, "temperature": 0, "seed": 7}
    whole = client.chat.completions.create(**params)  # type: ignore[call-overload]
    stream = client.chat.completions.create(**params, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 40
    assert usage_chunk.usage.prompt_tokens == whole.usage.prompt_tokens  # type: ignore[union-attr]


def test_max_tokens_and_max_completion_tokens_are_honoured_with_finish_reason_length(client: OpenAI) -> None:
    short = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, temperature=0)
    assert short.choices[0].finish_reason == "length"
    assert short.usage is not None and short.usage.completion_tokens == 5
    newer = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=7, temperature=0
    )
    assert newer.choices[0].finish_reason == "length"
    assert newer.usage is not None and newer.usage.completion_tokens == 7


def test_stop_string_ends_the_completion_before_it(client: OpenAI) -> None:
    free = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=40, temperature=0)
    text = free.choices[0].message.content or ""
    # Stop on a piece of text the model is known to produce, a little way in.
    stop = text[8:10]
    assert len(stop) == 2, f"the model produced too little text to pick a stop string: {text!r}"
    stopped = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=40, temperature=0, stop=[stop]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == text[: text.index(stop)]
    assert stop not in (stopped.choices[0].message.content or "")


def test_seeded_sampling_is_reproducible(client: OpenAI) -> None:
    params = {"model": MODEL, "messages": MESSAGES, "max_tokens": 20, "temperature": 1.0, "seed": 1234}
    first = client.chat.completions.create(**params)  # type: ignore[call-overload]
    second = client.chat.completions.create(**params)  # type: ignore[call-overload]
    assert first.choices[0].message.content == second.choices[0].message.content


async def test_sixteen_concurrent_streams_all_complete(async_client: AsyncOpenAI) -> None:
    async def one(i: int) -> tuple[str, int]:
        stream = await async_client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Request number {i}"}],
            max_tokens=32,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, completion_tokens = "", 0
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage is not None:
                completion_tokens = chunk.usage.completion_tokens
        return text, completion_tokens

    results = await asyncio.gather(*(one(i) for i in range(16)))
    assert len(results) == 16
    for text, completion_tokens in results:
        assert text
        assert completion_tokens == 32
    # Same prompt, greedy: the same answer whether alone or in a crowd.
    again, _ = await one(3)
    assert again == results[3][0]


def test_unknown_model_is_a_404_error_object(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["code"] == "model_not_found"
    assert error["param"] == "model"
    assert error["type"] == "invalid_request_error"
    assert MODEL in error["message"]


def test_malformed_bodies_are_400_error_objects_naming_the_param(stack: Stack) -> None:
    url = f"{stack.base_url}/v1/chat/completions"
    cases = {
        "temperature": {"model": MODEL, "messages": MESSAGES, "temperature": 9},
        "messages[0].role": {"model": MODEL, "messages": [{"content": "hi"}]},
        "model": {"messages": MESSAGES},
        "max_tokens": {"model": MODEL, "messages": MESSAGES, "max_tokens": "many"},
    }
    for param, body in cases.items():
        response = httpx.post(url, json=body, timeout=30)
        assert response.status_code == 400, (param, response.text)
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error"
        assert error["param"] == param
    broken = httpx.post(url, content=b"{not json", headers={"Content-Type": "application/json"}, timeout=30)
    assert broken.status_code == 400
    assert broken.json()["error"]["type"] == "invalid_request_error"


def test_openai_client_raises_bad_request_for_invalid_values(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, top_p=3)
    assert caught.value.body["param"] == "top_p"  # type: ignore[index]


def test_prompt_longer_than_the_model_takes_is_a_400(client: OpenAI) -> None:
    long_text = "word " * 3000
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long_text}])
    assert caught.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    assert caught.value.body["param"] == "messages"  # type: ignore[index]
    assert "1024 tokens" in caught.value.message


def test_models_and_health_endpoints(client: OpenAI, stack: Stack) -> None:
    models = client.models.list()
    # The demo model, more versions of it, the route over them and pipelines (tests/e2e/conftest.py).
    # Models first, in the config's order, then routes, then pipelines (tests/e2e/conftest.py).
    models_first = [MODEL, SECOND_VERSION, BROKEN_VERSION, COLD_VERSION, TRACED_VERSION, ROUTE]
    pipelines = [PIPELINE, ROUTER_PIPELINE, WARM_ROUTER_PIPELINE, BROKEN_ROUTER_PIPELINE, CASCADE_PIPELINE]
    assert [m.id for m in models.data] == models_first + pipelines
    assert httpx.get(f"{stack.base_url}/healthz", timeout=10).json()["status"] == "ok"
    ready = httpx.get(f"{stack.base_url}/readyz", timeout=10)
    assert ready.status_code == 200
    assert ready.json()["workers"] == 1


async def test_redis_holds_no_result_streams_after_requests_finish(client: OpenAI, stack: Stack) -> None:
    import redis.asyncio as aioredis

    from switchboard import keys

    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
    job_id = answer.id.removeprefix("chatcmpl-")
    redis = aioredis.Redis.from_url(stack.redis.url)
    try:
        for _ in range(50):  # the front door deletes a finished job's keys on its reader's next pass
            leftovers = [k async for k in redis.scan_iter(match=f"{keys.job_record(job_id)}*")]
            if not leftovers:
                break
            await asyncio.sleep(0.1)
        assert leftovers == []
        job_stream = keys.job_stream(MODEL)
        assert await redis.xlen(job_stream) == 0  # acknowledged jobs are deleted
        pending = await redis.xpending(job_stream, keys.JOB_GROUP)
        assert pending["pending"] == 0
        assert await redis.ttl(job_stream) > 0
    finally:
        await redis.aclose()
