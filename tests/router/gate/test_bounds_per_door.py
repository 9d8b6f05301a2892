"""Each bound on what a generation request may hold, sent to every generation endpoint, streamed and
not: a 400 in OpenAI's shape naming the parameter in that endpoint's own words, and nothing queued.

Before the gate, `/v1/responses` skipped every one of these (300 choices answered 200; 12,000 took a
worker 17.6 s; a 104 KB `text.format` schema 83 s), and `tool_choice: "required"` joined tools past
the schema bound into one grammar (eight tools of 32 KB: 118 s of a worker's time).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.config import FrontDoorConfig
from switchboard.local.redis_server import PrivateRedis
from tests.support.front_door_harness import MODEL, serving, settings_for

DEFAULTS = FrontDoorConfig()
SCHEMA_BYTES = DEFAULTS.max_structured_output_bytes
CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"


def nested(levels: int) -> dict[str, Any]:
    """A schema whose objects and arrays nest `levels` deep, as vLLM counts them."""
    schema: dict[str, Any] = (
        {"type": "string"} if levels % 2 else {"type": "array", "items": {"type": "string"}}
    )
    for _ in range((levels - 1) // 2):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def big_schema(size: int) -> dict[str, Any]:
    """An object schema of optional string properties, about `size` bytes as JSON."""
    return {
        "type": "object",
        "properties": {f"field_{i:06d}": {"type": "string"} for i in range(size // 30 + 1)},
    }


@dataclass(frozen=True)
class Bound:
    """One bound, as each endpoint is sent past it: the fields added to a small valid request and the
    `param` its refusal names (None: that endpoint has no such field)."""

    chat: tuple[dict[str, Any], str]
    responses: tuple[dict[str, Any], str]
    completions: tuple[dict[str, Any], str] | None = None


def _same(fields: dict[str, Any], param: str) -> Bound:
    return Bound(chat=(fields, param), responses=(fields, param), completions=(fields, param))


def _chat_tools(tools: list[tuple[str, dict[str, Any] | None]], choice: str = "auto") -> dict[str, Any]:
    listed = [
        {"type": "function", "function": {"name": n, **({"parameters": p} if p else {})}} for n, p in tools
    ]
    return {"tools": listed, "tool_choice": choice}


def _responses_tools(tools: list[tuple[str, dict[str, Any] | None]], choice: str = "auto") -> dict[str, Any]:
    listed = [{"type": "function", "name": n, **({"parameters": p} if p else {})} for n, p in tools]
    return {"tools": listed, "tool_choice": choice}


def _tools(
    tools: list[tuple[str, dict[str, Any] | None]], choice: str, param: str, responses_param: str
) -> Bound:
    return Bound(
        chat=(_chat_tools(tools, choice), param), responses=(_responses_tools(tools, choice), responses_param)
    )


CALL = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
EIGHT_TOOLS_OF_5_KB = [(f"f{i}", big_schema(5_000)) for i in range(8)]
USER_ITEM = {"role": "user", "content": "Hi"}

BOUNDS: dict[str, Bound] = {
    "300 choices": _same({"structured_outputs": {"choice": [f"c{i}" for i in range(300)]}}, "structured_outputs.choice"),
    "choices past the size bound": _same({"structured_outputs": {"choice": ["x" * 1000] * 40}}, "structured_outputs.choice"),
    "a schema past the size bound": Bound(
        chat=({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": big_schema(SCHEMA_BYTES)}}}, "response_format.json_schema.schema"),
        responses=({"text": {"format": {"type": "json_schema", "name": "s", "schema": big_schema(SCHEMA_BYTES)}}}, "text.format.schema"),
        completions=({"structured_outputs": {"json": big_schema(SCHEMA_BYTES)}}, "structured_outputs.json"),
    ),
    "a schema nested 65 levels": Bound(
        chat=({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": nested(65)}}}, "response_format.json_schema.schema"),
        responses=({"text": {"format": {"type": "json_schema", "name": "s", "schema": nested(65)}}}, "text.format.schema"),
        completions=({"structured_outputs": {"json": nested(65)}}, "structured_outputs.json"),
    ),
    "a regex past the size bound": _same({"structured_outputs": {"regex": "a" * (SCHEMA_BYTES + 1)}}, "structured_outputs.regex"),
    "an invalid regex": _same({"structured_outputs": {"regex": "(ab|cd"}}, "structured_outputs.regex"),
    "a grammar past the size bound": _same({"structured_outputs": {"grammar": "x" * (SCHEMA_BYTES + 1)}}, "structured_outputs.grammar"),
    "a long stop string": _same({"stop": ["END", "x" * 5000]}, "stop[1]"),
    "129 tools": _tools([(f"f{i}", None) for i in range(129)], "none", "tools", "tools"),
    "a tool's schema nested 65 levels": _tools([("f", nested(65))], "required", "tools[0].function.parameters", "tools[0].parameters"),
    "tools past the size bound": _tools([(f"f{i}", big_schema(SCHEMA_BYTES // 2)) for i in range(20)], "none", "tools", "tools"),
    "required tools joined past the schema bound": _tools(EIGHT_TOOLS_OF_5_KB, "required", "tools", "tools"),
    "2,049 messages": Bound(
        chat=({"messages": [USER_ITEM] * 2049}, "messages"),
        responses=({"instructions": "Be brief.", "input": [USER_ITEM] * 2048}, "input"),
    ),
    "257 content parts": Bound(
        chat=({"messages": [{"role": "user", "content": [{"type": "text", "text": ""}] * 257}]}, "messages[0].content"),
        responses=({"input": [{"role": "user", "content": [{"type": "input_text", "text": ""}] * 257}]}, "input[0].content"),
    ),
    "129 tool calls in one turn": Bound(
        chat=({"messages": [USER_ITEM, {"role": "assistant", "tool_calls": [{"id": f"c{i}", **CALL} for i in range(129)]}]}, "messages[1].tool_calls"),
        responses=({"input": [USER_ITEM, *({"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"} for i in range(129))]}, "input[129]"),
    ),
    "a long name": Bound(
        chat=({"messages": [{"role": "user", "content": "Hi", "name": "n" * 65}]}, "messages[0].name"),
        responses=({"input": [USER_ITEM, {"type": "function_call", "call_id": "c", "name": "n" * 65, "arguments": "{}"}]}, "input[1].name"),
    ),
    "a long tool call id": Bound(
        chat=({"messages": [USER_ITEM, {"role": "assistant", "tool_calls": [{"id": "i" * 257, **CALL}]}]}, "messages[1].tool_calls[0].id"),
        responses=({"input": [USER_ITEM, {"type": "function_call", "call_id": "i" * 257, "name": "f", "arguments": "{}"}]}, "input[1].call_id"),
    ),
}  # fmt: skip


def _request(path: str, fields: dict[str, Any], stream: bool) -> dict[str, Any]:
    if path == CHAT:
        base: dict[str, Any] = {"model": MODEL, "messages": [USER_ITEM], "max_tokens": 3}
    elif path == COMPLETIONS:
        base = {"model": MODEL, "prompt": "Hi", "max_tokens": 3}
    else:
        base = {"model": MODEL, "input": "Hi", "max_output_tokens": 3}
    return {**base, **fields, "stream": stream}


def _cases() -> list[Any]:
    cases = []
    for name, bound in BOUNDS.items():
        for path, sent in (
            (CHAT, bound.chat),
            (RESPONSES, bound.responses),
            (COMPLETIONS, bound.completions),
        ):
            if sent is not None:
                for stream in (False, True):
                    fields, param = sent
                    case_id = f"{name}-{path.rsplit('/', 1)[-1]}-{'stream' if stream else 'whole'}"
                    cases.append(pytest.param(path, _request(path, fields, stream), param, id=case_id))
    return cases


@pytest.fixture
async def front_door(redis_server: PrivateRedis) -> AsyncIterator[httpx.AsyncClient]:
    # A short timeout: where a request past a bound were queued after all, the test fails in seconds.
    async with serving(settings_for(redis_server.url, timeout_s=2.0)) as client:
        yield client


@pytest.mark.parametrize(("path", "body", "param"), _cases())
async def test_past_a_bound_every_door_refuses_by_name_and_queues_nothing(
    front_door: httpx.AsyncClient, redis: aioredis.Redis, path: str, body: dict[str, Any], param: str
) -> None:
    content = json.dumps(body, separators=(",", ":")).encode()
    assert len(content) < DEFAULTS.max_body_bytes, "the body must reach the gate's checks"
    response = await front_door.post(path, content=content, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param), error
    assert await redis.xlen(keys.job_stream(MODEL)) == 0
