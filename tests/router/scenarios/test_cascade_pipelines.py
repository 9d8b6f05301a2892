"""Cascade pipelines at a real front door, with real Redis and scripted workers: drafts confident
or not by their tokens' log-probabilities; the trace of a router's choice and a draft's verdict; a
route that sends its callers to a pipeline.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from switchboard import tracing
from switchboard.config import RouteConfig
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import Job
from tests.support.front_door_harness import serving
from tests.support.metric_samples import counter
from tests.support.pipeline_scenario import (
    CASCADE,
    CODER,
    DRAFT,
    GENERAL,
    MODELS,
    ROUTED,
    ROUTER,
    STRONG,
    answered_by_name,
    body,
    drafted,
    events_of,
    router_says,
    settings,
)
from tests.support.scripted_models import Scripted, scripted_models

# --- the cascade -----------------------------------------------------------------------------------


async def test_a_confident_draft_is_the_answer_streamed_or_not_without_the_logprobs_nobody_asked_for(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    def script(model: str, job: Job) -> Scripted:
        return Scripted(drafted("a sure answer", -0.2) if model == DRAFT else answered_by_name(model))

    async with (
        scripted_models(redis, MODELS, script) as served,
        serving(settings(redis_server.url)) as client,
    ):
        whole = await client.post("/v1/chat/completions", json=body(CASCADE))
        assert whole.status_code == 200, whole.text
        assert whole.json()["model"] == DRAFT and whole.headers["x-switchboard-cascade"] == "accepted"
        assert whole.json()["choices"][0]["message"]["content"] == "a sure answer"
        assert whole.json()["choices"][0].get("logprobs") is None
        streamed = await client.post(
            "/v1/chat/completions", json=body(CASCADE, True, stream_options={"include_usage": True})
        )
        assert streamed.status_code == 200, streamed.text
        events = events_of(streamed.text)
        assert (
            "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
            == "a sure answer"
        )
        assert events[-1]["usage"]["completion_tokens"] == 3
        assert streamed.text.rstrip().endswith("data: [DONE]")
        assert served.models == [DRAFT, DRAFT]
        (first, _) = served.of(DRAFT)
        assert first.sampling.logprobs == 0, "the draft is asked for its tokens' log-probabilities"


async def test_an_unsure_draft_is_replaced_by_the_strong_models_answer_whose_usage_counts_both(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    def script(model: str, job: Job) -> Scripted:
        return Scripted(drafted("maybe this", -2.5) if model == DRAFT else answered_by_name(model))

    before = counter(
        "switchboard:pipeline_steps", pipeline=CASCADE, step="draft", model=DRAFT, outcome="rejected"
    )
    async with (
        scripted_models(redis, MODELS, script) as served,
        serving(settings(redis_server.url)) as client,
    ):
        for stream in (False, True):
            answer = await client.post(
                "/v1/chat/completions",
                json=body(CASCADE, stream, stream_options={"include_usage": True} if stream else None),
            )
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-switchboard-model"] == STRONG
            assert answer.headers["x-switchboard-cascade"] == "escalated"
            assert answer.headers["x-switchboard-draft"] == DRAFT
            usage = events_of(answer.text)[-1]["usage"] if stream else answer.json()["usage"]
            assert usage == {"prompt_tokens": 20, "completion_tokens": 4, "total_tokens": 24}
        assert served.models == [DRAFT, STRONG, DRAFT, STRONG]
    after = counter(
        "switchboard:pipeline_steps", pipeline=CASCADE, step="draft", model=DRAFT, outcome="rejected"
    )
    assert after == before + 2


async def test_a_draft_that_breaks_the_requested_schema_or_is_cut_short_goes_to_the_strong_model(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    response_format = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    drafts = iter([drafted('{"n": "two"}', -0.1), drafted("a sure but cut", -0.1, "length")])

    def script(model: str, job: Job) -> Scripted:
        return Scripted(next(drafts) if model == DRAFT else answered_by_name(model))

    async with (
        scripted_models(redis, MODELS, script) as served,
        serving(settings(redis_server.url)) as client,
    ):
        wrong = await client.post("/v1/chat/completions", json=body(CASCADE, response_format=response_format))
        assert wrong.status_code == 200 and wrong.json()["model"] == STRONG
        cut = await client.post("/v1/chat/completions", json=body(CASCADE))
        assert cut.status_code == 200 and cut.json()["model"] == STRONG
        assert served.models == [DRAFT, STRONG, DRAFT, STRONG]


async def test_a_streamed_cascade_holds_the_draft_no_longer_than_its_bound(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    def script(model: str, job: Job) -> Scripted:
        if model == DRAFT:
            return Scripted(drafted("too late", -0.1), delay_s=2.0)
        return Scripted(answered_by_name(model))

    async with (
        scripted_models(redis, MODELS, script) as served,
        serving(settings(redis_server.url, hold_s=0.3)) as client,
    ):
        answer = await client.post("/v1/chat/completions", json=body(CASCADE, True))
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-switchboard-model"] == STRONG
        assert "strong answers" in answer.text
        assert served.models == [DRAFT, STRONG]


# --- the trace ---------------------------------------------------------------------------------------


@pytest.fixture
def spans() -> Any:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)
    yield exporter
    tracing.use_tracer_provider(None)
    provider.shutdown()


async def test_the_trace_shows_the_routers_choice_the_draft_rejected_and_each_steps_job(
    redis_server: PrivateRedis, redis: aioredis.Redis, spans: InMemorySpanExporter
) -> None:
    def script(model: str, job: Job) -> Scripted:
        if model == ROUTER:
            return Scripted(router_says("code", "chat", -0.05, -3.0))
        return Scripted(drafted("maybe", -2.5) if model == DRAFT else answered_by_name(model))

    async with scripted_models(redis, MODELS, script), serving(settings(redis_server.url)) as client:
        assert (await client.post("/v1/chat/completions", json=body(ROUTED))).status_code == 200
        assert (await client.post("/v1/chat/completions", json=body(CASCADE))).status_code == 200
    finished = spans.get_finished_spans()
    by_name = {span.name: span for span in finished}
    router = by_name["switchboard.pipeline.router"]
    assert router.attributes is not None
    assert router.attributes["switchboard.router.label"] == "code"
    assert router.attributes["switchboard.router.chosen_by"] == "router"
    assert router.attributes["switchboard.router.score.code"] > 0.9
    draft = by_name["switchboard.pipeline.draft"]
    assert draft.attributes is not None and draft.attributes["switchboard.draft.kept"] is False
    assert "below -1" in str(draft.attributes["switchboard.draft.reason"])
    # Each step's job is a span of its own inside its step's, and the answer's job beside them.
    jobs = [span for span in finished if span.name.startswith("chat ")]
    inside = {
        span.name
        for span in jobs
        if span.parent is not None and span.parent.span_id in (router.context.span_id, draft.context.span_id)
    }
    assert inside == {f"chat {ROUTER}", f"chat {DRAFT}"}
    assert {f"chat {CODER}", f"chat {STRONG}"} <= {span.name for span in jobs}


# --- a route naming a pipeline -----------------------------------------------------------------------


async def test_a_route_may_send_callers_to_a_pipeline_but_not_roll_one_out(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    configured = settings(redis_server.url)
    configured.routes = {"assistant": RouteConfig(targets={GENERAL: 0, CASCADE: 100})}

    def script(model: str, job: Job) -> Scripted:
        return Scripted(drafted("a sure answer", -0.2) if model == DRAFT else answered_by_name(model))

    async with scripted_models(redis, MODELS, script) as served, serving(configured) as client:
        answer = await client.post("/v1/chat/completions", json=body("assistant"))
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == DRAFT and answer.headers["x-switchboard-cascade"] == "accepted"
        assert answer.headers["x-switchboard-route"] == "assistant"
        assert served.models == [DRAFT]
        await client.put("/admin/routes/assistant/weights", json={"weights": {GENERAL: 100, CASCADE: 0}})
        refused = await client.post("/admin/routes/assistant/rollout", json={"canary": CASCADE})
        assert refused.status_code == 400 and "is a pipeline" in refused.json()["error"]["message"]
