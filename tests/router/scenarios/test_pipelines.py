"""Pipelines of fallbacks at a real front door, with real Redis and a scripted worker per model.

Each model's jobs are answered with the model's name, or failed by its engine; a model may also be
refused before its job exists (its context too short for the prompt). The client sees one answer,
from the first model that did not fail before the first byte, named in `model` and the headers.
"""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis

from switchboard import keys
from switchboard.config import ModelConfig, PipelineConfig, RouteConfig, Settings
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import ModelLimits, encode
from tests.support.front_door_harness import serving, settings_for
from tests.support.metric_samples import counter
from tests.support.scripted_models import models_answering

BIG, SMALL, SHORT, PIPELINE = "big", "small", "short", "resilient"
MODELS = (BIG, SMALL, SHORT)


def pipeline_settings(redis_url: str, *steps: str) -> Settings:
    settings = settings_for(redis_url, models=[ModelConfig(name=m, path="/nonexistent") for m in MODELS])
    settings.routes = {"chat": RouteConfig(targets={BIG: 100, SMALL: 0})}
    settings.pipelines = {PIPELINE: PipelineConfig(fallbacks=list(steps))}
    return settings


def body(stream: bool = False, content: str = "Hi") -> dict[str, Any]:
    return {"model": PIPELINE, "messages": [{"role": "user", "content": content}], "stream": stream}


async def test_the_first_model_that_does_not_fail_answers_streamed_or_not(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    before = counter("switchboard:fallbacks", via=PIPELINE, model=BIG, reason="engine_error")
    settings = pipeline_settings(redis_server.url, BIG, SMALL)
    async with (
        models_answering(redis, MODELS, failing=frozenset({BIG})) as served,
        serving(settings) as client,
    ):
        for stream in (False, True):
            answer = await client.post("/v1/chat/completions", json=body(stream))
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-switchboard-model"] == SMALL
            assert answer.headers["x-switchboard-pipeline"] == PIPELINE
            # Named by the job that answered: a fallback's job has an id of its own. (Its result
            # stream may be gone already: a client that closes at once after `[DONE]` reads as gone.)
            answered_by, answering_job = served.jobs[-1]
            assert answered_by == SMALL and answer.headers["x-request-id"] == answering_job.id
            if stream:
                events = [
                    json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: {")
                ]
                assert {event["model"] for event in events} == {SMALL}
            else:
                assert answer.json()["model"] == SMALL
                assert answer.json()["choices"][0]["message"]["content"] == SMALL
        assert served.models == [BIG, SMALL, BIG, SMALL]
        after = counter("switchboard:fallbacks", via=PIPELINE, model=BIG, reason="engine_error")
        assert after == before + 2
        listed = (await client.get("/v1/models")).json()["data"]
        card = next(card for card in listed if card["id"] == PIPELINE)
        assert card["owned_by"] == "switchboard-pipeline" and card["fallbacks"] == [BIG, SMALL]


async def test_a_prompt_too_long_for_one_model_goes_to_the_next_and_the_last_failure_is_the_answer(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    await redis.set(
        keys.model_limits(SHORT), encode(ModelLimits(max_model_len=16, vocab_size=1000, max_token_chars=4))
    )
    settings = pipeline_settings(redis_server.url, SHORT, BIG)
    async with (
        models_answering(redis, MODELS, failing=frozenset({BIG})) as served,
        serving(settings) as client,
    ):
        # SHORT refuses the prompt before any job exists; BIG's engine fails: BIG's error is the answer.
        failed = await client.post("/v1/chat/completions", json=body(content="word " * 100))
        assert failed.status_code == 500, failed.text
        assert failed.json()["error"]["message"] == "the engine died"
        assert failed.headers["x-switchboard-model"] == BIG
        assert served.models == [BIG], "the prompt that does not fit was never queued for SHORT"
        # A prompt that fits is SHORT's.
        fits = await client.post("/v1/chat/completions", json=body(content="Hi"))
        assert fits.status_code == 200 and fits.json()["model"] == SHORT


async def test_a_route_in_a_pipeline_places_the_caller_and_falls_back_to_its_stable_version_first(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    settings = pipeline_settings(redis_server.url, "chat", SHORT)
    settings.routes = {"chat": RouteConfig(targets={SMALL: 0, BIG: 100})}  # the caller is on BIG
    async with (
        models_answering(redis, MODELS, failing=frozenset({BIG})) as served,
        serving(settings) as client,
    ):
        answer = await client.post("/v1/chat/completions", json=body())
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == SMALL, "the route's stable version before the pipeline's next step"
        assert answer.headers["x-switchboard-route"] == "chat"
        assert served.models == [BIG, SMALL]
