"""`service_tier` at a real front door with real Redis and the official openai client: each tier's
job waits in its own line (the worker side of the order is tests/workers/jobs/test_tiers.py), the
answer says which tier served it, a key may ask only for the tiers it was given (priority is
granted, never assumed), and a tier that does not exist is a 400 naming the field."""

from __future__ import annotations

import hashlib

import openai
import pytest
import redis.asyncio as aioredis

from switchboard.config import ApiKey
from switchboard.local.redis_server import PrivateRedis
from tests.support.front_door_harness import MODEL, serving, settings_for
from tests.support.scripted_models import models_answering


def key(name: str, tiers: list[str] | None = None) -> ApiKey:
    sha = hashlib.sha256(f"sb-{name}".encode()).hexdigest()
    return ApiKey(name=name, sha256=sha, service_tiers=tiers or [])  # type: ignore[arg-type]


def sdk(base_url: str, name: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=f"sb-{name}", max_retries=0)


MESSAGES = [{"role": "user", "content": "Hi"}]


async def test_each_tier_is_queued_in_its_line_and_named_in_the_answer(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    settings = settings_for(redis_server.url)
    settings.auth.keys = [key("gold", ["priority", "default", "flex"])]
    async with models_answering(redis, [MODEL]) as served, serving(settings) as http:
        client = sdk(str(http.base_url).rstrip("/"), "gold")
        for asked, tier in [
            (None, "default"),
            ("auto", "default"),
            ("flex", "flex"),
            ("priority", "priority"),
        ]:
            extra = {} if asked is None else {"service_tier": asked}
            answer = await client.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=2, **extra
            )  # type: ignore[arg-type]
            assert answer.service_tier == tier
            assert served.of(MODEL)[-1].tier == tier
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=2,
            service_tier="flex",
            stream=True,  # type: ignore[arg-type]
        )
        assert {chunk.service_tier async for chunk in stream} == {"flex"}
        response = await client.responses.create(model=MODEL, input="Hi", service_tier="flex")
        assert response.service_tier == "flex" and served.of(MODEL)[-1].tier == "flex"


async def test_a_key_asks_only_for_its_tiers_and_an_unknown_tier_is_a_400(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    settings = settings_for(redis_server.url)
    settings.auth.keys = [key("plain"), key("flexible", ["flex"])]
    async with models_answering(redis, [MODEL]) as served, serving(settings) as http:
        base = str(http.base_url).rstrip("/")
        plain, flexible = sdk(base, "plain"), sdk(base, "flexible")
        with pytest.raises(openai.PermissionDeniedError) as refused:
            await plain.chat.completions.create(model=MODEL, messages=MESSAGES, service_tier="priority")  # type: ignore[arg-type]
        assert refused.value.code == "service_tier_not_allowed" and "priority" in refused.value.message
        answer = await plain.chat.completions.create(model=MODEL, messages=MESSAGES, service_tier="flex")  # type: ignore[arg-type]
        assert answer.service_tier == "flex"  # a key that lists none has default and flex
        with pytest.raises(openai.PermissionDeniedError):
            await flexible.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
        with pytest.raises(openai.BadRequestError) as bad:
            await plain.chat.completions.create(model=MODEL, messages=MESSAGES, service_tier="scale")  # type: ignore[arg-type]
        assert bad.value.body["param"] == "service_tier"  # type: ignore[index]
        refused_jobs = len(served.of(MODEL))
    assert refused_jobs == 1  # only the one answered was ever queued
