"""A chat whose tools and tool calls cannot fit the model's context is refused before it is queued.

The front door once counted only the messages' text, so a request made of tool definitions or of an
earlier call's arguments, far longer than the context, was queued for a worker that rendered and
tokenized it before refusing it. Against the front door on a real port and the session's Redis, with
the model's limits published as its workers publish them: such a request is a 400
`context_length_exceeded` with the model's job stream left empty, and what could fit is still
queued: the same request to a model whose template may not render tools, and arguments whose JSON
is long only in whitespace that the template does not repeat.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.config import ModelConfig
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import ModelLimits, encode
from tests.support.front_door_harness import MODEL, answer_ok, next_job, serving, settings_for

CHAT = "/v1/chat/completions"
# MODEL has a tool-call parser, so its template renders tools; PLAIN has none.
PLAIN = "plain"
LIMITS = ModelLimits(max_model_len=64, vocab_size=1000, max_token_chars=16)
# More characters than any text of the context's 64 tokens can hold.
TOO_LONG = LIMITS.max_model_len * LIMITS.max_token_chars + 1
USER = [{"role": "user", "content": "What is the weather?"}]


def weather_tool(description: str) -> dict[str, Any]:
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    return {
        "type": "function",
        "function": {"name": "weather", "description": description, "parameters": parameters},
    }


def earlier_call(arguments: str) -> list[dict[str, Any]]:
    """A conversation in which the assistant already called the tool with `arguments`."""
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": arguments}}
    return [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny."},
    ]


def chat(model: str = MODEL, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": USER, "max_tokens": 3, **fields}


REFUSED = {
    "tools longer than the context": chat(tools=[weather_tool("x" * TOO_LONG)]),
    "tools longer than the context, a named tool_choice": chat(
        tools=[weather_tool("x" * TOO_LONG)],
        tool_choice={"type": "function", "function": {"name": "weather"}},
    ),
    "an earlier call's arguments longer than the context": chat(
        messages=earlier_call(json.dumps({"city": "x" * TOO_LONG})), tools=[weather_tool("Weather.")]
    ),
}
FITTING = {
    # A template without tools renders none of them: the prompt is the question alone.
    "tools longer than the context, to a model whose template may not render them": chat(
        PLAIN, tools=[weather_tool("x" * TOO_LONG)], tool_choice="required"
    ),
    # The template writes the parsed arguments again, without the client's indentation.
    "arguments long only in whitespace": chat(
        messages=earlier_call('{"city":' + " " * TOO_LONG + '"Paris"}'), tools=[weather_tool("Weather.")]
    ),
}


@pytest.fixture
async def front_door(redis: aioredis.Redis, redis_server: PrivateRedis) -> Any:
    models = [
        ModelConfig(name=MODEL, path="/nonexistent", tool_call_parser="hermes"),
        ModelConfig(name=PLAIN, path="/nonexistent"),
    ]
    for model in (MODEL, PLAIN):
        await redis.set(keys.model_limits(model), encode(LIMITS))
    async with serving(settings_for(redis_server.url, 10.0, models=models)) as client:
        yield client


@pytest.mark.parametrize("case", list(REFUSED))
async def test_tools_and_tool_calls_longer_than_the_context_are_refused_before_queueing(
    front_door: httpx.AsyncClient, redis: aioredis.Redis, case: str
) -> None:
    response = await front_door.post(CHAT, json=REFUSED[case])
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (
        "context_length_exceeded",
        "messages",
        "invalid_request_error",
    )
    assert "the text of `messages` and `tools`" in error["message"]
    assert not await redis.exists(keys.job_stream(MODEL))


@pytest.mark.parametrize("case", list(FITTING))
async def test_what_could_fit_is_still_queued(
    front_door: httpx.AsyncClient, redis: aioredis.Redis, case: str
) -> None:
    body = FITTING[case]
    async with asyncio.timeout(10):
        sent = asyncio.create_task(front_door.post(CHAT, json=body))
        job = await next_job(redis, body["model"])
        await answer_ok(redis, job.id)
        response = await sent
    assert response.status_code == 200, response.text
