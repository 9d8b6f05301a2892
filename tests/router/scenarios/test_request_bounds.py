"""Requests that would stall a model's worker are refused at the front door, before they are queued.

Each hostile request below once reached a worker and kept its engine busy for seconds while other
clients' streams waited (12,000 choices: 28 s; 340,000 empty messages: 3.7 s of templating), or came
back as a 500. Against the front door on a real port and the session's Redis, each must be a 400 in
OpenAI's shape naming the parameter and the bound, and leave the model's job stream empty; a request
at the bounds must still be queued and answered.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.config import FrontDoorConfig
from switchboard.local.redis_server import PrivateRedis
from tests.support.front_door_harness import MODEL, answer_ok, next_job, serving, settings_for

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
DEFAULTS = FrontDoorConfig()
SCHEMA_BYTES = DEFAULTS.max_structured_output_bytes
USER = [{"role": "user", "content": "Hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": USER, "max_tokens": 3, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Hi", "max_tokens": 3, **fields}


def nested(levels: int) -> dict[str, Any]:
    """A JSON schema whose objects and arrays nest `levels` deep, counted as vLLM counts them (an
    object property is two levels: the object and its `properties`)."""
    schema: dict[str, Any] = (
        {"type": "string"} if levels % 2 else {"type": "array", "items": {"type": "string"}}
    )
    for _ in range((levels - 1) // 2):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def big_schema(size: int) -> dict[str, Any]:
    """An object schema of optional string properties, about `size` bytes as JSON."""
    count = size // 30 + 1
    return {"type": "object", "properties": {f"field_{i:06d}": {"type": "string"} for i in range(count)}}


def tool(name: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


# The attack as measured: 12,000 choices in a 0.34 MB request.
TWELVE_THOUSAND_CHOICES = [f"answer number {i:05d}, spelled out" for i in range(12_000)]
# 340,000 empty messages: 9.9 MB, just under the body limit.
EMPTY_MESSAGES = [{"role": "user", "content": ""}] * 340_000

# name: (path, body, param, code)
REFUSED: dict[str, tuple[str, dict[str, Any], str, str]] = {
    "12,000 choices": (CHAT, chat(structured_outputs={"choice": TWELVE_THOUSAND_CHOICES}), "structured_outputs.choice", "array_above_max_length"),
    "12,000 choices, completions": (COMPLETIONS, completion(structured_outputs={"choice": TWELVE_THOUSAND_CHOICES}), "structured_outputs.choice", "array_above_max_length"),
    "choices past the size bound": (CHAT, chat(structured_outputs={"choice": ["x" * 1000] * 40}), "structured_outputs.choice", "invalid_value"),
    "340,000 empty messages": (CHAT, chat(messages=EMPTY_MESSAGES), "messages", "array_above_max_length"),
    "a regex past the size bound": (CHAT, chat(structured_outputs={"regex": "a" * (SCHEMA_BYTES + 1)}), "structured_outputs.regex", "invalid_value"),
    "an invalid regex": (COMPLETIONS, completion(structured_outputs={"regex": "(ab|cd"}), "structured_outputs.regex", "invalid_value"),
    "a grammar past the size bound": (CHAT, chat(structured_outputs={"grammar": 'root ::= "' + "a" * SCHEMA_BYTES + '"'}), "structured_outputs.grammar", "invalid_value"),
    "a schema past the size bound": (CHAT, chat(structured_outputs={"json": big_schema(SCHEMA_BYTES)}), "structured_outputs.json", "invalid_value"),
    "a response_format schema past the size bound": (CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": "big", "schema": big_schema(SCHEMA_BYTES)}}), "response_format.json_schema.schema", "invalid_value"),
    "a schema nested 65 levels": (CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": "deep", "schema": nested(65)}}), "response_format.json_schema.schema", "invalid_value"),
    "a tool's schema nested 65 levels": (CHAT, chat(tools=[tool("f", nested(65))], tool_choice="required"), "tools[0].function.parameters", "invalid_value"),
    "a required tool call nested past 64 levels": (CHAT, chat(tools=[tool("f", nested(62))], tool_choice="required"), "tools", "invalid_value"),
    "tools past the size bound": (CHAT, chat(tools=[tool(f"f{i}", big_schema(SCHEMA_BYTES // 2)) for i in range(20)], tool_choice="none"), "tools", "invalid_value"),
    "129 tools": (CHAT, chat(tools=[tool(f"f{i}") for i in range(129)]), "tools", "invalid_value"),
    "a long stop string": (COMPLETIONS, completion(stop=["END", "x" * 5000]), "stop[1]", "invalid_value"),
    "257 content parts": (CHAT, chat(messages=[{"role": "user", "content": [{"type": "text", "text": ""}] * 257}]), "messages[0].content", "invalid_value"),
    "a long name": (CHAT, chat(messages=[{"role": "user", "content": "Hi", "name": "n" * 65}]), "messages[0].name", "invalid_value"),
    "129 tool calls": (CHAT, chat(messages=[*USER, {"role": "assistant", "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in range(129)]}]), "messages[1].tool_calls", "invalid_value"),
}  # fmt: skip


@pytest.fixture
async def front_door(redis_server: PrivateRedis, redis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    # A short timeout: where a hostile request were queued after all, the test fails in seconds.
    async with serving(settings_for(redis_server.url, timeout_s=3.0)) as client:
        yield client


async def post(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> httpx.Response:
    content = json.dumps(body, separators=(",", ":")).encode()
    return await client.post(path, content=content, headers={"content-type": "application/json"})


@pytest.mark.parametrize("case", list(REFUSED))
async def test_a_request_past_a_bound_is_a_400_naming_it_and_never_queued(
    front_door: httpx.AsyncClient, redis: aioredis.Redis, case: str
) -> None:
    path, body, param, code = REFUSED[case]
    assert len(json.dumps(body, separators=(",", ":"))) < DEFAULTS.max_body_bytes, (
        "the body must reach the front door's checks"
    )
    response = await post(front_door, path, body)
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code), error
    # The message states the bound, in words a client can act on.
    assert any(char.isdigit() for char in error["message"]) or "pair" in error["message"], error
    assert await redis.xlen(keys.job_stream(MODEL)) == 0


AT_THE_BOUNDS = {
    "256 choices": chat(structured_outputs={"choice": [f"choice {i}" for i in range(256)]}),
    "2,048 messages": chat(messages=[{"role": "user", "content": "Hi"}] * 2048),
    "a schema nested 64 levels": chat(
        response_format={"type": "json_schema", "json_schema": {"name": "deep", "schema": nested(64)}}
    ),
    "128 tools": chat(tools=[tool(f"f{i}") for i in range(128)], tool_choice="required"),
    "a regex with a character class": chat(structured_outputs={"regex": "[)(]+"}),
}


@pytest.mark.parametrize("case", list(AT_THE_BOUNDS))
async def test_a_request_at_the_bounds_is_queued_and_answered(
    front_door: httpx.AsyncClient, redis: aioredis.Redis, case: str
) -> None:
    sent = asyncio.create_task(post(front_door, CHAT, AT_THE_BOUNDS[case]))
    job = await next_job(redis)
    await answer_ok(redis, job.id)
    response = await sent
    assert response.status_code == 200, response.text[:500]
    assert response.json()["choices"][0]["message"]["content"] == "ok"


async def test_a_conversation_that_would_render_past_the_body_bound_is_refused(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    """Empty messages cost a chat template more than their bytes in the body: the estimate of the
    rendered prompt (text, tool calls, tools and the template's own text) is bounded like the body."""
    settings = settings_for(redis_server.url, timeout_s=3.0)
    settings.router.max_body_bytes = 64 * 1024
    messages = [{"role": "user", "content": ""}] * 2047 + [
        {
            "role": "assistant",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        }
    ]
    async with serving(settings) as client:
        response = await post(client, CHAT, chat(messages=messages))
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("messages", "invalid_value"), error
    assert "65,536" in error["message"], error
    assert await redis.xlen(keys.job_stream(MODEL)) == 0
