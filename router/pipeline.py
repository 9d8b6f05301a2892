"""The steps of one request through the front door, in order, and nothing else.

decode -> check -> resolve route and model -> build job -> admit -> queue -> relay. Each line is a call into
the folder that owns the step (`intake/`, `openai/`, `admission/`, `queue/`, `relay/`). A RedisError
at any step reaches `router.app`'s handler, which answers it with `RedisHealth.unavailable`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypeVar

import msgspec
from litestar import Request, Response
from litestar.response import Stream

from router.admission.auth import Caller
from router.admission.fits import ModelLimitsCache, check_job_fits
from router.admission.limits import Admission
from router.admission.models import ModelTable, require_live_worker
from router.gate.asks import ChatAsk, CompletionAsk, GenerationAsk, ResponsesAsk
from router.http.responses import Answer, json_response
from router.intake.call import Call
from router.intake.job import addressed, chat_job, completion_job
from router.intake.responses import in_responses_terms
from router.intake.resume import LAST_EVENT_ID_HEADER, ResumePoint, resume_point, wants_event_ids
from router.intake.tools import plan_tools
from router.openai.errors import InvalidRequestError, OpenAIError
from router.openai.pooling_checks import check_model_kind
from router.pipeline_shapes import PipelineShapes
from router.queue.run import JobRun
from router.queue.source import ChunkSource
from router.queue.starts import JobRuns
from router.relay.chat import chat_relay
from router.relay.completions import completion_relay
from router.relay.first_byte import StreamForm, stream_response
from router.relay.kinds import AnswerRelay
from router.relay.responses import responses_relay
from router.routing.fallback import failed_on_the_model, note_failure, note_fallback
from router.routing.resolve import Resolution, answering_model, resolve, resolve_step
from router.routing.shadow import ShadowTraffic
from router.routing.spent import SpentBefore
from router.routing.steps import (
    Draft,
)
from router.routing.table import RouteTable
from router.status.models import ModelStatusReader
from router.status.redis_health import RedisHealth
from router.telemetry.job_observer import JobObserver
from switchboard.config import ModelConfig, Settings
from switchboard.model_pipelines import PipelineLookup
from switchboard.wire import Chunk, Job

AnyAnswer = TypeVar("AnyAnswer", Response[bytes], Stream, Answer)


class Pipeline:
    """The steps of a chat, a completion, a response and a resumed request, over the parts each step
    calls."""

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
        self._shapes = PipelineShapes(
            self,
            status=status,
            pipelines=pipelines,
            health=health,
            timeout_s=settings.router.request_timeout_s,
        )

    async def answer(self, request: Request[Any, Any, Any], caller: Caller, ask: GenerationAsk) -> Answer:
        """`POST /v1/chat/completions`, `/v1/completions` or `/v1/responses`, past its gate. A response
        is answered as the chat request it amounts to; errors found on that name its own fields."""
        call = Call(request, caller, ask)
        try:
            return await self._call(call, ask.model, ask.stream)
        except InvalidRequestError as error:
            if not isinstance(ask, ResponsesAsk):
                raise
            translated = in_responses_terms(error)
            if translated is error:
                raise
            raise translated from error

    async def _call(self, call: Call, name: str, stream: bool) -> Answer:
        """The answer to `call`, naming `name`: its model's, or its route's or pipeline's."""
        resolution = self._resolve(call, name)
        call.resume = resume_point(call.http.headers.get(LAST_EVENT_ID_HEADER), stream=stream)
        return await self.first_answer(resolution if call.resume is None else resolution.alone(), call)

    async def _on(
        self, resolution: Resolution, call: Call, job_id: str | None, draft: Draft | None
    ) -> Answer:
        """The answer of the resolved model to `call`, as job `job_id` (a cascade's `draft`, judged)."""
        if isinstance(call.ask, ChatAsk):
            return await self._chat_on(resolution, call, call.ask, job_id, draft)
        return await self._completion_on(resolution, call, call.ask, job_id, draft)

    async def _chat_on(
        self,
        resolution: Resolution,
        call: Call,
        ask: ChatAsk,
        job_id: str | None,
        draft: Draft | None,
    ) -> Answer:
        """A chat completion (or a response) answered by the resolved model, as job `job_id`."""
        request, caller, resume = call.http, call.caller, call.resume
        chat = msgspec.structs.replace(ask.chat, model=resolution.served)
        responses = ask.responses if isinstance(ask, ResponsesAsk) else None
        model = self._served_model(
            resolution, caller, "chat completions" if responses is None else "responses"
        )
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
        relay: AnswerRelay = chat_relay(chat, job, tools)
        if responses is not None:
            relay = responses_relay(responses, job, tools, model=chat.model, logprobs=chat.logprobs)
        self._health.require_up()
        if resume is not None:
            return await self._resumed(job, caller, resume, relay, form, resolution)
        # A model with a tool-call parser has a template that renders tools (`least_chat_chars`).
        await check_job_fits(self._limits, job, template_renders_tools=model.tool_call_parser is not None)
        if draft is not None:
            return await self._shapes.drafted(job, call, relay, draft, form=form, resolution=resolution)
        return await self._answered(job, call, relay, form=form, resolution=resolution)

    async def _completion_on(
        self,
        resolution: Resolution,
        call: Call,
        ask: CompletionAsk,
        job_id: str | None,
        draft: Draft | None,
    ) -> Answer:
        """A plain completion answered by the resolved model, as job `job_id`."""
        request, caller, resume, prompts = call.http, call.caller, call.resume, ask.prompts
        completion = msgspec.structs.replace(ask.completion, model=resolution.served)
        self._served_model(resolution, caller, "completions")
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
            return await self._shapes.drafted(job, call, relay, draft, form=form, resolution=resolution)
        return await self._answered(job, call, relay, form=form, resolution=resolution)

    async def first_answer(self, resolution: Resolution, call: Call, draft: Draft | None = None) -> Answer:
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
        if pipeline is not None and call.resume is not None:
            # A resumed stream's job exists and its record names its model: no router or draft runs
            # again. The request is rebuilt for the model the pipeline answers with first.
            first = self.step(call, answering_model(resolution.served, self._pipelines), resolution)
            return await self._on(resolution.served_by(first.served), call, call.ids.next(), None)
        if pipeline is not None and pipeline.router is not None:
            return await self._shapes.routed(resolution, call, pipeline.router)
        if pipeline is not None and pipeline.cascade is not None:
            return await self._shapes.cascaded(resolution, call, pipeline.cascade)
        return await self._on(resolution, call, call.ids.next(), draft)

    def _resolve(self, call: Call, name: str) -> Resolution:
        """What serves a request naming `name`, and its fallbacks (`router.routing`)."""
        return resolve(self._routes, self._pipelines, name, call.caller, call.stickiness_key)

    def step(self, call: Call, step: str, within: Resolution) -> Resolution:
        """What serves a pipeline's step `step` for `call` (`router.routing.resolve.resolve_step`)."""
        return resolve_step(self._routes, self._pipelines, step, call.stickiness_key, within)

    def _served_model(self, resolution: Resolution, caller: Caller, api: str) -> ModelConfig:
        """The serving model's configuration: a 404 unless routed here; a 403 unless the caller's key
        may use it, directly or through the route or pipeline it named; a 400 for a pooling model,
        which the `api` (chat completions, completions) cannot ask anything of."""
        if resolution.chosen_for_the_caller:
            model = self._models.require(resolution.served)
        else:
            model = self._models.resolve(resolution.served, caller)
        check_model_kind(model, "generate", api)
        return model

    async def _answered(
        self,
        job: Job,
        call: Call,
        relay: AnswerRelay,
        *,
        form: StreamForm,
        resolution: Resolution,
    ) -> Answer:
        """The job queued and its answer relayed, named after the model that wrote it; its usage
        counts what earlier steps of the request spent too."""
        # A copy for the route's shadow version, in the background, drawn before the job is queued.
        draw = self._shadow.draw(job) if self._shadow is not None else None
        try:
            run = await self.queued(job, call.caller)
        except BaseException:
            if draw is not None and self._shadow is not None:
                self._shadow.drop(draw)
            raise
        if draw is not None and self._shadow is not None:
            self._shadow.mirror(run.job, draw)
        source = run if call.spent.nothing else SpentBefore(run, call.spent)
        answer = await self.relayed(source, relay, stream=call.stream, form=form)
        return labelled(answer, resolution.served_by(run.served_model))

    async def queued(self, job: Job, caller: Caller) -> JobRun:
        """Admit `job` for `caller` and queue it: 429 at a limit; 503 with Retry-After for a model no
        live worker may hold, or whose last load failed."""
        job = addressed(job, caller.name, self._runs.router_id)
        await require_live_worker(self._status, job.model)
        observer = JobObserver(job)
        with observer.phase("switchboard.admission"):
            # Admitted in the enqueue's round trip (`JobRuns.start`): here only what it will send.
            admitting = self._admission.admitting(job, caller)
        return await self._runs.start(job, admitting, observer)

    async def _resumed(
        self,
        job: Job,
        caller: Caller,
        resume: ResumePoint,
        relay: AnswerRelay,
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

    async def relayed(
        self, run: ChunkSource, relay: AnswerRelay, *, stream: bool, form: StreamForm
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


async def served_chunks(run: ChunkSource, relay: AnswerRelay) -> AsyncIterator[Chunk]:
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
