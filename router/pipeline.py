"""The steps of one request through the front door, in order, and nothing else.

decode -> check -> resolve route and model -> build job -> admit -> queue -> relay. Each line is a call into
the folder that owns the step (`intake/`, `openai/`, `admission/`, `queue/`, `relay/`). A RedisError
at any step reaches `router.app`'s handler, which answers it with `RedisHealth.unavailable`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
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
from router.intake.job import addressed, chat_job, completion_job
from router.intake.resume import LAST_EVENT_ID_HEADER, ResumePoint, resume_point, wants_event_ids
from router.intake.tools import plan_tools
from router.openai.chat import ChatCompletionRequest
from router.openai.checks import check_chat, check_completion
from router.openai.completions import CompletionRequest
from router.openai.errors import OpenAIError
from router.queue.run import JobRun, JobRuns
from router.relay.chat import ChatRelay, chat_relay
from router.relay.completions import CompletionRelay, completion_relay
from router.relay.first_byte import StreamForm, stream_response
from router.routing.fallback import failed_on_the_model, note_failure, note_fallback
from router.routing.resolve import Resolution, resolve, stickiness_key
from router.routing.shadow import ShadowTraffic
from router.routing.table import RouteTable
from router.status.models import ModelStatusReader
from router.status.redis_health import RedisHealth
from router.telemetry.job_observer import JobObserver
from router.telemetry.requests import arrival_id, new_request_id
from switchboard.config import ModelConfig, Settings
from switchboard.model_pipelines import PipelineLookup
from switchboard.wire import Chunk, Job

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
        resolution = self._resolve(request, chat.model, chat.user, caller)
        resume = resume_point(request.headers.get(LAST_EVENT_ID_HEADER), stream=chat.stream)

        async def answer_on(served: Resolution, job_id: str | None) -> Answer:
            return await self._chat_on(served, request, chat, caller, resume, job_id)

        return await self._first_answer(resolution if resume is None else resolution.alone(), answer_on)

    async def completion(self, request: Request[Any, Any, Any], caller: Caller) -> Answer:
        """`POST /v1/completions`."""
        completion = await decode_body(request, _completion_request)
        prompts = check_completion(completion)
        resolution = self._resolve(request, completion.model, completion.user, caller)
        resume = resume_point(request.headers.get(LAST_EVENT_ID_HEADER), stream=completion.stream)

        async def answer_on(served: Resolution, job_id: str | None) -> Answer:
            return await self._completion_on(served, request, completion, prompts, caller, resume, job_id)

        return await self._first_answer(resolution if resume is None else resolution.alone(), answer_on)

    async def _chat_on(
        self,
        resolution: Resolution,
        request: Request[Any, Any, Any],
        chat: ChatCompletionRequest,
        caller: Caller,
        resume: ResumePoint | None,
        job_id: str | None,
    ) -> Answer:
        """A chat completion answered by the resolved model, as job `job_id`."""
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
        return await self._answered(job, caller, relay, stream=chat.stream, form=form, resolution=resolution)

    async def _completion_on(
        self,
        resolution: Resolution,
        request: Request[Any, Any, Any],
        completion: CompletionRequest,
        prompts: int,
        caller: Caller,
        resume: ResumePoint | None,
        job_id: str | None,
    ) -> Answer:
        """A plain completion answered by the resolved model, as job `job_id`."""
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
        return await self._answered(
            job, caller, relay, stream=completion.stream, form=form, resolution=resolution
        )

    async def _first_answer(
        self, resolution: Resolution, answer_on: Callable[[Resolution, str | None], Awaitable[Answer]]
    ) -> Answer:
        """The answer of the resolved model; should it fail before the first byte, that of its first
        fallback that does not (`router.routing.fallback`). Errors name the model that gave them.

        The first job takes the request's id; each fallback's job a new one, which `x-request-id`
        then names (the failed job's results are its own, and are cleaned up as any job's)."""
        job_id = arrival_id()
        while True:
            try:
                with resolution.naming_errors():
                    return await answer_on(resolution, job_id)
            except OpenAIError as error:
                note_failure(resolution, error)
                fallback = resolution.fallback()
                if fallback is None or not failed_on_the_model(error):
                    raise
                note_fallback(resolution, fallback.served, error)
            resolution, job_id = fallback, new_request_id()

    def _resolve(
        self, request: Request[Any, Any, Any], name: str, user: str | None, caller: Caller
    ) -> Resolution:
        """The model that serves a request naming `name`, and its fallbacks (`router.routing`)."""
        return resolve(self._routes, self._pipelines, name, caller, stickiness_key(request, user, caller))

    def _served_model(self, resolution: Resolution, caller: Caller) -> ModelConfig:
        """The serving model's configuration: a 404 unless routed here; a 403 unless the caller's key
        may use it, directly or through the route or pipeline it named."""
        if resolution.chosen_for_the_caller:
            return self._models.require(resolution.served)
        return self._models.resolve(resolution.served, caller)

    async def _answered(
        self,
        job: Job,
        caller: Caller,
        relay: ChatRelay | CompletionRelay,
        *,
        stream: bool,
        form: StreamForm,
        resolution: Resolution,
    ) -> Answer:
        """The job queued and its answer relayed, named after the model that wrote it."""
        run = await self._queued(job, caller)
        if self._shadow is not None:
            self._shadow.mirror(run.job)  # a copy for the route's shadow version, in the background
        answer = await self._relayed(run, relay, stream=stream, form=form)
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
        self, run: JobRun, relay: ChatRelay | CompletionRelay, *, stream: bool, form: StreamForm
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


async def served_chunks(run: JobRun, relay: ChatRelay | CompletionRelay) -> AsyncIterator[Chunk]:
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
