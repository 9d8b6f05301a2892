"""The steps of pipelines that are more than a chain of fallbacks: a router model's choice and a
cascade's draft (`switchboard.model_pipelines`). Each runs ordinary jobs through the request's
pipeline (`router.pipeline`, the host) and leaves the answer to another of its steps, or gives it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import Protocol

import msgspec
from redis.exceptions import RedisError

from router.admission.auth import Caller
from router.gate.asks import CompletionAsk
from router.http.responses import Answer
from router.intake.call import Call
from router.intake.job import step_job
from router.openai.checks import invalid
from router.openai.errors import OpenAIError
from router.queue.held import HeldAnswer, collect
from router.queue.run import JobRun
from router.queue.source import ChunkSource
from router.relay.first_byte import StreamForm
from router.relay.kinds import AnswerRelay
from router.routing.cascade import client_chunks, draft_failed, draft_sampling, draft_too_slow, judge_draft
from router.routing.fallback import failed_on_the_model
from router.routing.resolve import PIPELINE_ATTRIBUTE, Resolution
from router.routing.router_model import Ask, choose
from router.routing.spent import usage_of
from router.routing.steps import (
    CASCADE_HEADER,
    CHOICE_HEADER,
    DRAFT_HEADER,
    ROUTER_HEADER,
    STEP_SECONDS,
    STEPS,
    Draft,
    DraftRejected,
    choice_attributes,
    set_attributes,
    step_span,
)
from router.routing.warm_targets import WarmTargets
from router.status.models import ModelStatusReader
from router.status.redis_health import RedisHealth
from switchboard.model_pipelines import CascadeConfig, PipelineLookup, RouterConfig
from switchboard.wire import ChatMessage, Chunk, Job, SamplingParams, Usage


class StepHost(Protocol):
    """What the steps call of the request's pipeline (`router.pipeline.Pipeline`)."""

    async def first_answer(
        self, resolution: Resolution, call: Call, draft: Draft | None = None
    ) -> Answer: ...

    async def queued(self, job: Job, caller: Caller) -> JobRun: ...

    async def relayed(
        self, run: ChunkSource, relay: AnswerRelay, *, stream: bool, form: StreamForm
    ) -> Answer: ...

    def step(self, call: Call, step: str, within: Resolution) -> Resolution: ...


class PipelineShapes:
    """A router's choice and a cascade's draft, run for one front door's requests."""

    def __init__(
        self,
        host: StepHost,
        *,
        status: ModelStatusReader,
        pipelines: PipelineLookup,
        health: RedisHealth,
        timeout_s: float,
    ) -> None:
        self._host = host
        self._status = status
        self._pipelines = pipelines
        self._health = health
        self._timeout_s = timeout_s

    # --- a router model's choice ----------------------------------------------------------------

    async def routed(self, resolution: Resolution, call: Call, config: RouterConfig) -> Answer:
        """The answer of the target a router model chooses for `call` (`router.routing.router_model`);
        should the target fail before its first byte, the default target's."""
        pipeline = resolution.served
        router = self._host.step(call, config.model, resolution.alone())
        targets = {t.model: self._host.step(call, t.model, resolution) for t in config.targets.values()}
        warm = WarmTargets(self._status, targets, self._pipelines)
        started = time.perf_counter()
        attributes = {PIPELINE_ATTRIBUTE: pipeline, "switchboard.router.model": router.served}
        with step_span("switchboard.pipeline.router", attributes) as span:
            try:
                text = call.text(config.request_chars)
                choice = await choose(config, text, self._asker(router, call), warm.is_warm)
            finally:
                warm.close()
            set_attributes(span, choice_attributes(choice))
        STEP_SECONDS.labels(pipeline, "router").observe(time.perf_counter() - started)
        STEPS.labels(pipeline, "router", router.served, choice.chosen_by).inc()
        call.spent.add(choice.usage)
        how = choice.label if choice.chosen_by == "router" else f"{choice.label}; {choice.chosen_by}"
        chosen = self._host.step(call, choice.target, resolution).noted(
            (ROUTER_HEADER, router.served), (CHOICE_HEADER, how)
        )
        default = config.targets[config.default].model
        if choice.target != default:
            fallback = self._host.step(call, default, resolution)
            chosen = chosen.then((fallback.served, fallback.route), *fallback.later)
        return await self._host.first_answer(chosen, call)

    def _asker(self, router: Resolution, call: Call) -> Ask:
        """How the router's job is run for `call`: queued under the caller's key (its tokens are the
        request's; should its model refuse it, the router route's stable version is asked), its
        chunks yielded as they come. Closed before the job's end (its label was known), the job is
        stopped and its end read in the background, for the usage it tells."""

        async def ask(
            messages: tuple[ChatMessage, ...], sampling: SamplingParams
        ) -> AsyncGenerator[Chunk, None]:
            run = await self._router_run(router, messages, sampling, call)
            try:
                async for chunk in run.chunks():
                    yield chunk
            finally:
                if run.ended:
                    await run.close()
                else:
                    call.spent.add_later(_stopped_usage(run))

        return ask

    async def _router_run(
        self, router: Resolution, messages: tuple[ChatMessage, ...], sampling: SamplingParams, call: Call
    ) -> JobRun:
        attempt: Resolution | None = router
        while True:
            assert attempt is not None
            job = step_job(attempt.served, messages, sampling, timeout_s=self._timeout_s)
            self._health.require_up()
            try:
                return await self._host.queued(job, call.caller)
            except OpenAIError as error:
                if not failed_on_the_model(error) or attempt.fallback() is None:
                    raise
            attempt = attempt.fallback()

    # --- a cascade --------------------------------------------------------------------------------

    async def cascaded(self, resolution: Resolution, call: Call, config: CascadeConfig) -> Answer:
        """The draft model's answer if it is kept (`router.routing.cascade`), else the strong one's."""
        pipeline = resolution.served
        if isinstance(call.ask, CompletionAsk) and call.ask.completion.echo:
            # The echoed prompt would be judged as the draft's text and log-probabilities.
            raise invalid("echo", f"The cascade {pipeline!r} cannot echo the prompt; send `echo` without it.")
        draft = self._host.step(call, config.draft, resolution.alone())
        plan = Draft(pipeline, config)
        started = time.perf_counter()
        with step_span("switchboard.pipeline.draft", {PIPELINE_ATTRIBUTE: pipeline}) as span:
            try:
                return await self._host.first_answer(draft, call, plan)
            except DraftRejected as rejected:
                verdict, outcome = rejected.verdict, rejected.outcome
            except OpenAIError as error:
                if not failed_on_the_model(error):
                    raise
                verdict, outcome = draft_failed(error.message), "failed"
            finally:
                STEP_SECONDS.labels(pipeline, "draft").observe(time.perf_counter() - started)
            set_attributes(
                span, {"switchboard.draft.kept": False, "switchboard.draft.reason": verdict.reason}
            )
        STEPS.labels(pipeline, "draft", plan.model or draft.served, outcome).inc()
        strong = self._host.step(call, config.strong, resolution).noted(
            (CASCADE_HEADER, "escalated"), (DRAFT_HEADER, plan.model or draft.served)
        )
        return await self._host.first_answer(strong, call)

    async def drafted(
        self,
        job: Job,
        call: Call,
        relay: AnswerRelay,
        draft: Draft,
        *,
        form: StreamForm,
        resolution: Resolution,
    ) -> Answer:
        """The draft's answer, held until judged: returned if kept, else DraftRejected (with what it
        spent, which the strong model's answer then counts)."""
        draft.model = job.model
        drafting = msgspec.structs.replace(job, sampling=draft_sampling(job.sampling))
        run = await self._host.queued(drafting, call.caller)
        try:
            chunks = await collect(run, draft.hold_s if call.stream else run.job.deadline - time.time())
        finally:
            await run.close()
        if chunks is None:
            raise DraftRejected(draft_too_slow(draft.hold_s), "too_slow")
        verdict = judge_draft(
            chunks,
            min_mean_logprob=draft.min_mean_logprob,
            structure=job.sampling.structured,
            length_is_normal=call.max_tokens_set,
        )
        if not verdict.accepted:
            call.spent.add(usage_of(chunks))  # the strong model's answer counts it
            raise DraftRejected(verdict, "rejected")
        STEPS.labels(draft.pipeline, "draft", job.model, "accepted").inc()
        earlier = await call.spent.settled()
        told = client_chunks(chunks, wanted_logprobs=call.wants_logprobs, extra_usage=earlier)
        held = HeldAnswer(run.job, told, served_model=run.served_model)
        answer = await self._host.relayed(held, relay, stream=call.stream, form=form)
        resolution.served_by(run.served_model).noted((CASCADE_HEADER, "accepted")).label(answer)
        return answer


# How long the end of a router's job stopped early is waited for (its usage).
STOPPED_END_S = 5.0


async def _stopped_usage(run: JobRun) -> Usage | None:
    """The usage a job tells once stopped (`JobRun.stop_generating`): read to its end, then closed."""
    usage = None
    try:
        await run.stop_generating()
        async with asyncio.timeout(STOPPED_END_S):
            async for chunk in run.chunks():
                usage = chunk.usage or usage
    except (TimeoutError, OpenAIError, RedisError):
        pass  # its tokens go uncounted; the job ends at its cancel mark or its deadline all the same
    finally:
        await run.close()
    return usage
