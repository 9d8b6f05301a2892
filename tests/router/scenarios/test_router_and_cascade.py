"""Router-model and cascade pipelines at a real front door, with real Redis and scripted workers.

The router model's answers carry log-probabilities as an engine's do (the label's token, with the
alternatives it weighed); a draft's answers are confident or not by their tokens' log-probabilities.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from switchboard import keys, tracing
from switchboard.config import ModelConfig, Settings
from switchboard.local.redis_server import PrivateRedis
from switchboard.model_pipelines import CascadeConfig, PipelineConfig, RouterConfig, RouterTarget
from switchboard.route_config import RouteConfig
from switchboard.wire import Chunk, Job, JobError, SlotStatus, TokenLogprob, TopLogprob, Usage
from tests.support.front_door_harness import advertise, serving, settings_for, worker_record
from tests.support.metric_samples import counter
from tests.support.scripted_models import Scripted, scripted_models

ROUTER, CODER, GENERAL, DRAFT, STRONG = "router", "coder", "general", "draft", "strong"
MODELS = (ROUTER, CODER, GENERAL, DRAFT, STRONG)
ROUTED, CASCADE = "smart", "thrifty"
USED = Usage(prompt_tokens=10, completion_tokens=2)


def settings(
    redis_url: str, *, timeout_s: float = 2.0, warm_margin: float = 0.1, hold_s: float = 5.0
) -> Settings:
    configured = settings_for(redis_url, models=[ModelConfig(name=m, path="/nonexistent") for m in MODELS])
    targets = {
        "code": RouterTarget(model=CODER, description="programming questions"),
        "chat": RouterTarget(model=GENERAL, description="everything else"),
    }
    router = RouterConfig(
        model=ROUTER, targets=targets, default="chat", timeout_s=timeout_s, warm_margin=warm_margin
    )
    cascade = CascadeConfig(draft=DRAFT, strong=STRONG, min_mean_logprob=-1.0, hold_s=hold_s)
    configured.pipelines = {ROUTED: PipelineConfig(router=router), CASCADE: PipelineConfig(cascade=cascade)}
    return configured


def router_says(label: str, other: str, logprob: float, other_logprob: float) -> list[Chunk]:
    """The router's answer `label`, having weighed `other` too."""
    top = (TopLogprob(label, logprob), TopLogprob(other, other_logprob))
    return [
        Chunk(text=label, logprobs=(TokenLogprob(label, logprob, top),), finish_reason="stop", usage=USED)
    ]


def drafted(text: str, logprob: float, finish_reason: str = "stop") -> list[Chunk]:
    """A draft of one chunk per word, each token `logprob` likely."""
    words = text.split(" ")
    chunks = [
        Chunk(
            text=word if i == 0 else f" {word}",
            logprobs=(TokenLogprob(word, logprob, (TopLogprob(word, logprob),)),),
        )
        for i, word in enumerate(words)
    ]
    return [
        *chunks,
        Chunk(finish_reason=finish_reason, usage=Usage(prompt_tokens=10, completion_tokens=len(words))),
    ]  # type: ignore[arg-type]


def answered_by_name(model: str) -> list[Chunk]:
    return [Chunk(text=f"{model} answers", finish_reason="stop", usage=USED)]


def body(model: str, stream: bool = False, **fields: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Fix my loop"}],
        "stream": stream,
        **fields,
    }


def events_of(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


# --- the router model ------------------------------------------------------------------------------


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
        # the router's job was told to stop,
        assert await redis.exists(keys.cancel_mark(served.of(ROUTER)[0].id))
        # and its usage, told by its end, is in the answer's.
        assert answer.json()["usage"]["prompt_tokens"] == 20
