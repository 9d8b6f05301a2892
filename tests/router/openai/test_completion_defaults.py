"""OpenAI's defaults that differ by endpoint: `max_tokens` is 16 on completions, unbounded on chat.

At the front door, against a real Redis: what the queued job asks the engine for.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.local.redis_server import PrivateRedis
from tests.support.front_door_harness import BODY, MODEL, next_job, serving, settings_for

COMPLETION = {"model": MODEL, "prompt": "Once upon a time"}
CHAT = {key: value for key, value in BODY.items() if key != "max_tokens"}


@pytest.mark.parametrize(
    ("path", "body", "max_tokens"),
    [
        ("/v1/completions", COMPLETION, 16),  # OpenAI's and vLLM's default
        ("/v1/completions", {**COMPLETION, "max_tokens": None}, None),  # as vLLM: to the context's end
        ("/v1/completions", {**COMPLETION, "max_tokens": 40}, 40),
        ("/v1/chat/completions", CHAT, None),  # chat: to the end of the context
    ],
    ids=["completion", "completion, null", "completion, 40", "chat"],
)
async def test_max_tokens_left_out(
    redis: aioredis.Redis, redis_server: PrivateRedis, path: str, body: dict[str, Any], max_tokens: int | None
) -> None:
    async with serving(settings_for(redis_server.url, timeout_s=0.3)) as client:
        request = asyncio.create_task(client.post(path, json=body))
        job = await next_job(redis)
        await request  # its deadline passes: nobody answers it
    assert job.sampling.max_tokens == max_tokens
    await redis.delete(keys.job_stream(MODEL))
