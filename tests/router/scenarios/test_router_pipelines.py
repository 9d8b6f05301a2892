"""Router-model pipelines at a real front door, with real Redis and scripted workers.

The router model's answers carry log-probabilities as an engine's do (the label's tokens, with the
alternatives it weighed), so the front door's scoring, cold-start preference and early stop run on
what a worker would send.
"""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import Chunk, Job, JobError, SlotStatus, TokenLogprob, TopLogprob
from tests.support.front_door_harness import advertise, serving, worker_record
from tests.support.metric_samples import counter
from tests.support.pipeline_scenario import (
    CODER,
    GENERAL,
    MODELS,
    ROUTED,
    ROUTER,
    USED,
    answered_by_name,
    body,
    events_of,
    router_says,
    settings,
)
from tests.support.scripted_models import Scripted, scripted_models
from tests.support.waits import eventually


async def test_the_router_models_choice_answers_and_the_answer_names_the_router_and_counts_its_tokens(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    def script(model: str, job: Job) -> Scripted:
        if model == ROUTER:
            return Scripted(router_says("code", "chat", -0.05, -3.0))
        return Scripted(answered_by_name(model))

    before = counter(
        "switchboard:pipeline_steps", pipeline=ROUTED, step="router", model=ROUTER, outcome="router"
    )
    async with (
        scripted_models(redis, MODELS, script) as served,
        serving(settings(redis_server.url)) as client,
    ):
        answer = await client.post("/v1/chat/completions", json=body(ROUTED))
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == CODER
        assert answer.json()["choices"][0]["message"]["content"] == "coder answers"
        assert answer.headers["x-switchboard-router"] == ROUTER
        assert answer.headers["x-switchboard-router-choice"] == "code"
        assert answer.headers["x-switchboard-pipeline"] == ROUTED
        # The usage counts the router's tokens and the answer's.
        assert (
            answer.json()["usage"]["prompt_tokens"] == 20 and answer.json()["usage"]["completion_tokens"] == 4
        )
        assert served.models == [ROUTER, CODER]
        (router_job,) = served.of(ROUTER)
        assert router_job.sampling.structured is not None and router_job.sampling.structured.choice == (
            "code",
            "chat",
        )
        assert router_job.messages is not None and "Fix my loop" in (router_job.messages[-1].content or "")
        assert "programming questions" in (router_job.messages[-1].content or "")
    after = counter(
        "switchboard:pipeline_steps", pipeline=ROUTED, step="router", model=ROUTER, outcome="router"
    )
    assert after == before + 1


async def test_a_warm_target_close_to_the_routers_best_wins_over_a_cold_one(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    await advertise(redis, worker_record("w1", SlotStatus(model=GENERAL, state="warm")))

    def script(model: str, job: Job) -> Scripted:
        if model == ROUTER:  # code 0.55, chat 0.45: close
            return Scripted(router_says("code", "chat", -0.598, -0.799))
        return Scripted(answered_by_name(model))

    async with (
        scripted_models(redis, MODELS, script) as served,
        serving(settings(redis_server.url, warm_margin=0.2)) as client,
    ):
        answer = await client.post("/v1/chat/completions", json=body(ROUTED))
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == GENERAL, "the coder is cold; the general model is warm and close"
        assert answer.headers["x-switchboard-router-choice"] == "chat; warm"
        assert served.models == [ROUTER, GENERAL]


async def test_a_clear_choice_of_a_cold_target_is_kept(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    await advertise(redis, worker_record("w1", SlotStatus(model=GENERAL, state="warm")))

    def script(model: str, job: Job) -> Scripted:
        if model == ROUTER:  # code 0.95: far ahead
            return Scripted(router_says("code", "chat", -0.05, -3.0))
        return Scripted(answered_by_name(model))

    async with (
        scripted_models(redis, MODELS, script),
        serving(settings(redis_server.url, warm_margin=0.2)) as client,
    ):
        answer = await client.post("/v1/chat/completions", json=body(ROUTED))
        assert answer.json()["model"] == CODER and answer.headers["x-switchboard-router-choice"] == "code"


@pytest.mark.parametrize("failure", ["engine_error", "too_slow"])
async def test_a_router_that_fails_or_is_too_slow_leaves_the_choice_to_the_default(
    redis_server: PrivateRedis, redis: aioredis.Redis, failure: str
) -> None:
    def script(model: str, job: Job) -> Scripted:
        if model == ROUTER and failure == "engine_error":
            return Scripted([Chunk(error=JobError(code="engine_error", message="the engine died"))])
        if model == ROUTER:
            return Scripted(router_says("code", "chat", -0.05, -3.0), delay_s=1.0)
        return Scripted(answered_by_name(model))

    before = counter(
        "switchboard:pipeline_steps", pipeline=ROUTED, step="router", model=ROUTER, outcome="default"
    )
    async with (
        scripted_models(redis, MODELS, script),
        serving(settings(redis_server.url, timeout_s=0.3)) as client,
    ):
        for stream in (False, True):
            answer = await client.post("/v1/chat/completions", json=body(ROUTED, stream))
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-switchboard-model"] == GENERAL
            assert answer.headers["x-switchboard-router-choice"] == "chat; default"
    after = counter(
        "switchboard:pipeline_steps", pipeline=ROUTED, step="router", model=ROUTER, outcome="default"
    )
    assert after == before + 2


async def test_a_chosen_target_that_fails_before_its_first_byte_is_answered_by_the_default(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    def script(model: str, job: Job) -> Scripted:
        if model == ROUTER:
            return Scripted(router_says("code", "chat", -0.05, -3.0))
        if model == CODER:
            return Scripted([Chunk(error=JobError(code="engine_error", message="the engine died"))])
        return Scripted(answered_by_name(model))

    async with (
        scripted_models(redis, MODELS, script) as served,
        serving(settings(redis_server.url)) as client,
    ):
        answer = await client.post("/v1/chat/completions", json=body(ROUTED))
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == GENERAL
        assert served.models == [ROUTER, CODER, GENERAL]


async def test_a_resumed_stream_of_a_routed_answer_runs_no_router_again(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    def script(model: str, job: Job) -> Scripted:
        if model == ROUTER:
            return Scripted(router_says("code", "chat", -0.05, -3.0))
        words = [Chunk(text=f"{model} {i} ") for i in range(3)]
        return Scripted([*words, Chunk(finish_reason="stop", usage=USED)])

    async with (
        scripted_models(redis, MODELS, script) as served,
        serving(settings(redis_server.url)) as client,
    ):
        headers = {"x-switchboard-resumable": "1"}
        first = await client.post("/v1/chat/completions", json=body(ROUTED, True), headers=headers)
        assert first.status_code == 200 and first.headers["x-switchboard-model"] == CODER
        ids = [line[4:] for line in first.text.splitlines() if line.startswith("id: ")]
        assert len(ids) >= 3
        resumed = await client.post(
            "/v1/chat/completions", json=body(ROUTED, True), headers={"last-event-id": ids[0]}
        )
        assert resumed.status_code == 200, resumed.text
        assert resumed.headers["x-switchboard-model"] == CODER
        rest = "".join(
            e["choices"][0]["delta"].get("content") or "" for e in events_of(resumed.text) if e["choices"]
        )
        assert rest == "coder 1 coder 2 "
        assert served.models == [ROUTER, CODER], "the resume read the answer's job; nothing ran again"


async def test_the_routers_answer_is_read_until_it_names_a_label_and_its_usage_still_counts(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    def script(model: str, job: Job) -> Scripted:
        if model != ROUTER:
            return Scripted(answered_by_name(model))
        c = TokenLogprob("c", -0.1, (TopLogprob("c", -0.1), TopLogprob("ch", -2.5)))
        o = TokenLogprob("o", -0.01, (TopLogprob("o", -0.01),))
        chunks = [Chunk(text="co", logprobs=(c, o)), Chunk(text="de", finish_reason="stop", usage=USED)]
        return Scripted(chunks, pause_before_last_s=1.0)

    async with (
        scripted_models(redis, MODELS, script) as served,
        serving(settings(redis_server.url)) as client,
    ):
        answer = await client.post("/v1/chat/completions", json=body(ROUTED))
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == CODER
        assert served.models == [ROUTER, CODER]
        # "co" leaves "chat": the coder's job was queued without waiting for the router's end,
        assert served.taken_at[1] - served.taken_at[0] < 0.9
        # the router's job was told to stop (its worker hears it when its writes return),

        async def router_told_to_stop() -> bool:
            return served.of(ROUTER)[0].id in served.told_to_stop

        await eventually(router_told_to_stop, what="the router's job told to stop")
        # and its usage, told by its end, is in the answer's.
        assert answer.json()["usage"]["prompt_tokens"] == 20
