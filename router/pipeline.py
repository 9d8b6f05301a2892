"""The steps of one request through the front door, in order, and nothing else.

decode -> check -> resolve route and model -> build job -> admit -> queue -> relay. Each line is a call into
the folder that owns the step (`intake/`, `openai/`, `admission/`, `queue/`, `relay/`). A RedisError
at any step reaches `router.app`'s handler, which answers it with `RedisHealth.unavailable`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import msgspec
from litestar import Request, Response
from litestar.response import Stream

from router.admission.auth import Caller
from router.admission.fits import ModelLimitsCache, check_job_fits
from router.admission.limits import Admission
from router.admission.models import ModelTable, require_live_worker
from router.http.responses import json_response
from router.intake.body import decode_body
from router.intake.call import Call
from router.intake.job import addressed, chat_job, completion_job, step_job
from router.intake.resume import LAST_EVENT_ID_HEADER, ResumePoint, resume_point, wants_event_ids
from router.intake.tools import plan_tools
from router.openai.chat import ChatCompletionRequest
from router.openai.checks import check_chat, check_completion
from router.openai.completions import CompletionRequest
from router.openai.errors import OpenAIError
from router.queue.held import HeldAnswer, collect
from router.queue.source import ChunkSource
from router.queue.run import JobRun, JobRuns
from router.relay.chat import ChatRelay, chat_relay
from router.relay.completions import CompletionRelay, completion_relay
from router.relay.first_byte import StreamForm, stream_response
from router.relay.sse import error_for
from router.routing.cascade import client_chunks, draft_failed, draft_sampling, draft_too_slow, judge_draft
from router.routing.fallback import failed_on_the_model, note_failure, note_fallback
from router.routing.resolve import PIPELINE_ATTRIBUTE, Resolution, resolve, resolve_step
from router.routing.router_model import Ask, choose
from router.routing.shadow import ShadowTraffic
from router.routing.spent import SpentBefore, usage_of
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
from router.routing.table import RouteTable
from router.routing.warm_targets import WarmTargets
from router.status.models import ModelStatusReader
from router.status.redis_health import RedisHealth
from router.telemetry.job_observer import JobObserver
from switchboard.config import ModelConfig, Settings
from switchboard.model_pipelines import CascadeConfig, PipelineLookup, RouterConfig
from switchboard.wire import ChatMessage, Chunk, Job, SamplingParams

_chat_request = msgspec.json.Decoder(ChatCompletionRequest)
_completion_request = msgspec.json.Decoder(CompletionRequest)

Answer = Response[bytes] | Stream
AnyAnswer = TypeVar("AnyAnswer", Response[bytes], Stream, Answer)


class Pipeline:
    """The steps of a chat, a completion and a resumed request, over the parts each step calls."""

    def __init__(
        self,
        settings: Settings,
        *,
        models: ModelTable,
        health: RedisHealth,
        status: ModelStatusReader,
        limits: ModelLimitsCache,
        admission: Admission,
        runs: JobRuns,
        routes: RouteTable,
        pipelines: PipelineLookup,
        shadow: ShadowTraffic | None = None,
    ) -> None:
        self._router = settings.router
        self._models = models
        self._routes = routes
        self._pipelines = pipelines
        self._health = health
        self._status = status
        self._limits = limits
        self._admission = admission
        self._runs = runs
        self._shadow = shadow

    async def chat(self, request: Request[Any, Any, Any], caller: Caller) -> Answer:
        """`POST /v1/chat/completions`."""
        chat = await decode_body(request, _chat_request)
        check_chat(chat)
        call = Call(request, caller, chat.user, chat=chat)
        return await self._call(call, chat.model, chat.stream)

    async def completion(self, request: Request[Any, Any, Any], caller: Caller) -> Answer:
        """`POST /v1/completions`."""
        completion = await decode_body(request, _completion_request)
        prompts = check_completion(completion)
        call = Call(request, caller, completion.user, completion=completion, prompts=prompts)
        return await self._call(call, completion.model, completion.stream)

    async def _call(self, call: Call, name: str, stream: bool) -> Answer:
        """The answer to `call`, naming `name`: its model's, or its route's or pipeline's."""
        resolution = self._resolve(call, name)
        call.resume = resume_point(call.http.headers.get(LAST_EVENT_ID_HEADER), stream=stream)
        return await self._first_answer(resolution if call.resume is None else resolution.alone(), call)

    async def _on(
        self, resolution: Resolution, call: Call, job_id: str | None, draft: Draft | None
    ) -> Answer:
        """The answer of the resolved model to `call`, as job `job_id` (a cascade's `draft`, judged)."""
        if call.chat is not None:
            return await self._chat_on(resolution, call, call.chat, job_id, draft)
        assert call.completion is not None
        return await self._completion_on(resolution, call, call.completion, job_id, draft)

    async def _chat_on(
        self,
        resolution: Resolution,
        call: Call,
        chat: ChatCompletionRequest,
        job_id: str | None,
        draft: Draft | None,
    ) -> Answer:
        """A chat completion answered by the resolved model, as job `job_id`."""
        request, caller, resume = call.http, call.caller, call.resume
        chat = msgspec.structs.replace(chat, model=resolution.served)
        model = self._served_model(resolution, caller)
        tools, structured = plan_tools(chat, chat.model, model.tool_call_parser)
        job = chat_job(
            chat,
            timeout_s=self._router.request_timeout_s,
            structured=structured,
            parse_tool_calls=tools.mode == "auto",
            job_id=job_id,
        )
        job = resolution.applied_to(job)
        job = resume.applied_to(job) if resume is not None else job
        form = stream_form(request, resume)
        relay = chat_relay(chat, job, tools)
        self._health.require_up()
        if resume is not None:
            return await self._resumed(job, caller, resume, relay, form, resolution)
        # A model with a tool-call parser has a template that renders tools (`least_chat_chars`).
        await check_job_fits(self._limits, job, template_renders_tools=model.tool_call_parser is not None)
        if draft is not None:
            return await self._drafted(job, call, relay, draft, form=form, resolution=resolution)
        return await self._answered(job, call, relay, form=form, resolution=resolution)

    async def _completion_on(
        self,
        resolution: Resolution,
        call: Call,
        completion: CompletionRequest,
        job_id: str | None,
        draft: Draft | None,
    ) -> Answer:
        """A plain completion answered by the resolved model, as job `job_id`."""
        request, caller, resume, prompts = call.http, call.caller, call.resume, call.prompts
        completion = msgspec.structs.replace(completion, model=resolution.served)
        self._served_model(resolution, caller)
        job = completion_job(completion, timeout_s=self._router.request_timeout_s, job_id=job_id)
        job = resolution.applied_to(job)
        job = resume.applied_to(job) if resume is not None else job
        form = stream_form(request, resume)
        relay = completion_relay(completion, job, prompts)
        self._health.require_up()
        if resume is not None:
            return await self._resumed(job, caller, resume, relay, form, resolution)
        await check_job_fits(self._limits, job)
        if draft is not None:
            return await self._drafted(job, call, relay, draft, form=form, resolution=resolution)
        return await self._answered(job, call, relay, form=form, resolution=resolution)

    async def _first_answer(self, resolution: Resolution, call: Call, draft: Draft | None = None) -> Answer:
        """The answer of what the request resolved to; should it fail before the first byte, that of its
        first fallback that does not (`router.routing.fallback`). Errors name the model that gave them.

        What serves may be a router or a cascade pipeline, run here as a step of its own."""
        while True:
            try:
                with resolution.naming_errors():
                    return await self._answer_of(resolution, call, draft)
            except OpenAIError as error:
                note_failure(resolution, error)
                fallback = resolution.fallback()
                if fallback is None or not failed_on_the_model(error):
                    raise
                note_fallback(resolution, fallback.served, error)
            resolution = fallback

    async def _answer_of(self, resolution: Resolution, call: Call, draft: Draft | None) -> Answer:
        pipeline = self._pipelines.get(resolution.served)
        if pipeline is not None and pipeline.router is not None:
            return await self._routed(resolution, call, pipeline.router)
        if pipeline is not None and pipeline.cascade is not None:
            return await self._cascaded(resolution, call, pipeline.cascade)
        return await self._on(resolution, call, call.ids.next(), draft)

    def _resolve(self, call: Call, name: str) -> Resolution:
        """What serves a request naming `name`, and its fallbacks (`router.routing`)."""
        return resolve(self._routes, self._pipelines, name, call.caller, call.stickiness_key)

    def _step(self, call: Call, step: str, within: Resolution) -> Resolution:
        """What serves a pipeline's step `step` for `call` (`router.routing.resolve.resolve_step`)."""
        return resolve_step(self._routes, self._pipelines, step, call.stickiness_key, within)

    # --- a router model's choice ----------------------------------------------------------------

    async def _routed(self, resolution: Resolution, call: Call, config: RouterConfig) -> Answer:
        """The answer of the target a router model chooses for `call` (`router.routing.router_model`);
        should the target fail before its first byte, the default target's."""
        pipeline = resolution.served
        router = self._step(call, config.model, resolution.alone())
        targets = {t.model: self._step(call, t.model, resolution) for t in config.targets.values()}
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
        chosen = self._step(call, choice.target, resolution).noted(
            (ROUTER_HEADER, router.served), (CHOICE_HEADER, how)
        )
        default = config.targets[config.default].model
        if choice.target != default:
            fallback = self._step(call, default, resolution)
            chosen = chosen.then((fallback.served, fallback.route), *fallback.later)
        return await self._first_answer(chosen, call)

    def _asker(self, router: Resolution, call: Call) -> Ask:
        """How the router's job is run for `call`: queued under the caller's key (its tokens are the
        request's), its chunks read to the last; its own fallbacks if it is a route's canary."""

        async def ask(messages: tuple[ChatMessage, ...], sampling: SamplingParams) -> list[Chunk]:
            attempt: Resolution | None = router
            while attempt is not None:
                try:
                    return await self._asked(attempt.served, messages, sampling, call)
                except OpenAIError as error:
                    if not failed_on_the_model(error) or attempt.fallback() is None:
                        raise
                attempt = attempt.fallback()
            raise AssertionError("unreachable")

        return ask

    async def _asked(
        self, model: str, messages: tuple[ChatMessage, ...], sampling: SamplingParams, call: Call
    ) -> list[Chunk]:
        job = step_job(model, messages, sampling, timeout_s=self._router.request_timeout_s)
        self._health.require_up()
        run = await self._queued(job, call.caller)
        try:
            chunks = [chunk async for chunk in run.chunks()]
        finally:
            await run.close()
        failed = next((chunk.error for chunk in chunks if chunk.error is not None), None)
        if failed is not None:
            raise error_for(failed, model)
        return chunks

    # --- a cascade --------------------------------------------------------------------------------

    async def _cascaded(self, resolution: Resolution, call: Call, config: CascadeConfig) -> Answer:
        """The draft model's answer if it is kept (`router.routing.cascade`), else the strong one's."""
        pipeline = resolution.served
        draft = self._step(call, config.draft, resolution.alone())
        plan = Draft(pipeline, config)
        started = time.perf_counter()
        with step_span("switchboard.pipeline.draft", {PIPELINE_ATTRIBUTE: pipeline}) as span:
            try:
                return await self._first_answer(draft, call, plan)
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
        strong = self._step(call, config.strong, resolution).noted(
            (CASCADE_HEADER, "escalated"), (DRAFT_HEADER, plan.model or draft.served)
        )
        return await self._first_answer(strong, call)

    async def _drafted(
        self,
        job: Job,
        call: Call,
        relay: ChatRelay | CompletionRelay,
        draft: Draft,
        *,
        form: StreamForm,
        resolution: Resolution,
    ) -> Answer:
        """The draft's answer, held until judged: returned if kept, else DraftRejected (with what it
        spent, which the strong model's answer then counts)."""
        draft.model = job.model
        drafting = msgspec.structs.replace(job, sampling=draft_sampling(job.sampling))
        run = await self._queued(drafting, call.caller)
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
        told = client_chunks(chunks, wanted_logprobs=call.wants_logprobs, extra_usage=call.spent.usage)
        held = HeldAnswer(run.job, told, served_model=run.served_model)
        answer = await self._relayed(held, relay, stream=call.stream, form=form)
        return labelled(answer, resolution.served_by(run.served_model).noted((CASCADE_HEADER, "accepted")))

    def _served_model(self, resolution: Resolution, caller: Caller) -> ModelConfig:
        """The serving model's configuration: a 404 unless routed here; a 403 unless the caller's key
        may use it, directly or through the route or pipeline it named."""
        if resolution.chosen_for_the_caller:
            return self._models.require(resolution.served)
        return self._models.resolve(resolution.served, caller)

    async def _answered(
        self,
        job: Job,
        call: Call,
        relay: ChatRelay | CompletionRelay,
        *,
        form: StreamForm,
        resolution: Resolution,
    ) -> Answer:
        """The job queued and its answer relayed, named after the model that wrote it; its usage
        counts what earlier steps of the request spent too."""
        run = await self._queued(job, call.caller)
        if self._shadow is not None:
            self._shadow.mirror(run.job)  # a copy for the route's shadow version, in the background
        source = run if call.spent.usage is None else SpentBefore(run, call.spent.usage)
        answer = await self._relayed(source, relay, stream=call.stream, form=form)
        return labelled(answer, resolution.served_by(run.served_model))

    async def _queued(self, job: Job, caller: Caller) -> JobRun:
        """Admit `job` for `caller` and queue it: 429 at a limit; 503 with Retry-After for a model no
        live worker may hold, or whose last load failed."""
        job = addressed(job, caller.name, self._runs.router_id)
        await require_live_worker(self._status, job.model)
        observer = JobObserver(job)
        with observer.phase("switchboard.admission"):
            ticket = await self._admission.admit(job, caller)
        return await self._runs.start(job, ticket, observer)

    async def _resumed(
        self,
        job: Job,
        caller: Caller,
        resume: ResumePoint,
        relay: ChatRelay | CompletionRelay,
        form: StreamForm,
        resolution: Resolution,
    ) -> Stream:
        """The rest of a streamed answer whose client lost its connection; nothing new is queued.

        A resume is a request: admitted against its key's limits first (429, and nothing of the job
        read or counted, when refused), then only the key that sent the job may read it (404). It
        is answered by the model its job was queued for, whatever a route's weights say now."""
        observer = JobObserver(job, resumed=True)
        with observer.phase("switchboard.admission"):
            ticket = await self._admission.admit_resume(job, caller)
        run, earlier = await self._runs.resume(job, ticket, resume.entry_id, observer)
        relay.model = run.job.model
        relay.replay(earlier)
        answer = await stream_response(run, relay, self._router, self._status, form)
        return labelled(answer, resolution.served_by(run.job.model))

    async def _relayed(
        self, run: ChunkSource, relay: ChatRelay | CompletionRelay, *, stream: bool, form: StreamForm
    ) -> Answer:
        """The job's result, streamed, or whole once it has finished. A client that leaves cancels the
        job either way (`router.http.disconnect`)."""
        if stream:
            return await stream_response(run, relay, self._router, self._status, form)
        try:
            return json_response(await relay.assemble(served_chunks(run, relay)))
        finally:
            await run.close()


def labelled(answer: AnyAnswer, resolution: Resolution) -> AnyAnswer:
    """`answer` with headers naming the model that served it, and the route it came through."""
    resolution.label(answer)
    return answer


async def served_chunks(run: ChunkSource, relay: ChatRelay | CompletionRelay) -> AsyncIterator[Chunk]:
    """The run's chunks, the relay naming the model that writes them (`JobRun.served_model`)."""
    async for chunk in run.chunks():
        relay.model = run.served_model
        yield chunk


def stream_form(request: Request[Any, Any, Any], resume: ResumePoint | None) -> StreamForm:
    """How a streamed answer is framed for this client (`router.intake.resume`)."""
    return StreamForm(
        event_ids=wants_event_ids(request.headers, resume),
        skip=resume.events_had if resume is not None else 0,
    )
