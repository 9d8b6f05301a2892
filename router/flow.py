"""The steps of one generation request through the front door, in order, and nothing else.

The handler passed the request's gate (`router.gate`: decoded, checked, bounded) and hands on its
ask. Then: resolve the name (route, pipeline, fallbacks: `router.routing.resolve`) -> run a model
pipeline's own step where one serves (a router model's choice, a cascade's draft) -> the served
model -> the job and its relay (`router.intake.prepare`) -> fits the context (`router.admission`)
-> admitted and queued (`router.queue.starts`) -> relayed (`router.relay`). A failure before the
first byte moves on to the next fallback. Each line is a call into the folder that owns the step;
a RedisError at any step reaches `router.app`'s handler, which answers it with a 503.
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.response import Stream

from router.admission.auth import Caller
from router.admission.fits import ModelLimitsCache, check_job_fits
from router.admission.model_table import ModelTable
from router.gate.asks import ChatAsk, GenerationAsk, ResponsesAsk
from router.gate.responses_as_chat import in_responses_words
from router.http.answers import Answer
from router.intake.job import tier_of
from router.intake.prepare import Prepared, prepared
from router.intake.request_images import check_images_taken, fetched_images
from router.intake.resume import LAST_EVENT_ID_HEADER, ResumePoint, resume_point, wants_event_ids
from router.openai.errors import OpenAIError
from router.openai.pooling_checks import check_model_kind
from router.relay.answer_relays import AnswerRelay
from router.relay.first_byte import StreamForm, stream_response
from router.routing.call import Call
from router.routing.fallback import failed_on_the_model, note_failure, note_fallback
from router.routing.pipelines.cascade_step import draft_step, drafted, escalated, judged
from router.routing.pipelines.router_step import routed
from router.routing.pipelines.spent_tokens import SpentBefore
from router.routing.pipelines.step_parts import StepParts
from router.routing.pipelines.steps import Draft
from router.routing.resolve import Resolution, answering_model, resolve
from router.routing.rollouts.shadow import ShadowTraffic
from switchboard.config import CascadeConfig, ModelConfig, Settings
from switchboard.wire import ImageInput, Job


class RequestFlow:
    """The steps of chat completions, completions and responses (and their resumed streams)."""

    def __init__(
        self,
        settings: Settings,
        *,
        models: ModelTable,
        limits: ModelLimitsCache,
        parts: StepParts,
        shadow: ShadowTraffic,
    ) -> None:
        self._timeout_s = settings.router.request_timeout_s
        self._settings = settings.router
        self._models = models
        self._limits = limits
        self._parts = parts
        self._shadow = shadow

    async def answer(self, request: Request[Any, Any, Any], caller: Caller, ask: GenerationAsk) -> Answer:
        """The answer to a request past its gate. A response is answered as the chat request it
        amounts to; errors found on that name its own fields."""
        if isinstance(ask, ChatAsk):
            caller.require_tier(tier_of(ask.chat.service_tier))
        call = Call(request, caller, ask)
        call.resume = resume_point(request.headers.get(LAST_EVENT_ID_HEADER), stream=ask.stream)
        resolution = resolve(
            self._parts.routes, self._parts.pipelines, ask.model, caller, call.stickiness_key
        )
        with in_responses_words(isinstance(ask, ResponsesAsk)):
            return await self.first_answer(resolution if call.resume is None else resolution.alone(), call)

    async def first_answer(self, resolution: Resolution, call: Call, draft: Draft | None = None) -> Answer:
        """The answer of what the request resolved to; should it fail before the first byte, that of its
        first fallback that does not (`router.routing.fallback`). Errors name the model that gave them."""
        while True:
            try:
                with resolution.naming_errors():
                    return await self._answer_of(resolution, call, draft)
            except OpenAIError as error:
                note_failure(resolution, error, self._parts.runs.observations)
                fallback = resolution.fallback()
                if fallback is None or not failed_on_the_model(error):
                    raise
                note_fallback(resolution, fallback.served, error)
            resolution = fallback

    async def _answer_of(self, resolution: Resolution, call: Call, draft: Draft | None) -> Answer:
        """What serves may be a model, or a router or cascade pipeline, whose step runs first."""
        pipeline = self._parts.pipelines.get(resolution.served)
        if pipeline is not None and call.resume is not None:
            # A resumed stream's job exists and its record names its model: no router or draft runs
            # again. The request is rebuilt for the model the pipeline answers with first.
            first = self._parts.step(
                call, answering_model(resolution.served, self._parts.pipelines), resolution
            )
            return await self._served(resolution.served_by(first.served), call, None)
        if pipeline is not None and pipeline.router is not None:
            return await self.first_answer(await routed(resolution, call, pipeline.router, self._parts), call)
        if pipeline is not None and pipeline.cascade is not None:
            return await self._cascaded(resolution, call, pipeline.cascade)
        return await self._served(resolution, call, draft)

    async def _cascaded(self, resolution: Resolution, call: Call, config: CascadeConfig) -> Answer:
        """The draft's answer if it is kept, else the strong model's (`router.routing.pipelines.cascade_step`)."""
        draft, plan = draft_step(resolution, call, config, self._parts)
        with judged(draft, plan):
            return await self.first_answer(draft, call, plan)
        return await self.first_answer(escalated(resolution, call, config, draft, plan, self._parts), call)

    async def _served(self, resolution: Resolution, call: Call, draft: Draft | None) -> Answer:
        """The resolved model's answer to `call`, as the request's next job (a cascade's `draft`: judged)."""
        model = self._served_model(resolution, call)
        resume = call.resume
        images = await self._images_for(call, model)
        job_of = prepared(
            call.ask,
            model,
            timeout_s=self._timeout_s,
            job_id=call.ids.next(),
            owner=call.caller.owner,
            images=images,
            as_queued=lambda job: (
                resume.applied_to(resolution.applied_to(job)) if resume else resolution.applied_to(job)
            ),
        )
        job = job_of.job
        form = stream_form(call.http, call.resume)
        self._parts.health.require_up()
        if call.resume is not None:
            return await self._resumed(job, call, call.resume, job_of.relay, form, resolution)
        await check_job_fits(self._limits, job, template_renders_tools=job_of.template_renders_tools)
        if draft is not None:
            return await drafted(
                job, call, job_of.relay, draft, form=form, resolution=resolution, parts=self._parts
            )
        return await self._answered(job, call, job_of, form, resolution)

    def _served_model(self, resolution: Resolution, call: Call) -> ModelConfig:
        """The serving model's configuration: a 404 unless routed here; a 403 unless the caller's key
        may use it, directly or through the route or pipeline it named; a 400 for a pooling model."""
        if resolution.chosen_for_the_caller:
            model = self._models.require(resolution.served)
        else:
            model = self._models.resolve(resolution.served, call.caller)
        check_model_kind(model, "generate", call.ask.api)
        return model

    async def _images_for(self, call: Call, model: ModelConfig) -> tuple[ImageInput, ...]:
        """The request's images for `model`'s job: a 400 if it takes none; fetched once per request.
        A resumed stream's job is queued already: it needs none."""
        sent = call.ask.images if isinstance(call.ask, ChatAsk) else ()
        if not sent or call.resume is not None:
            return ()
        check_images_taken(sent, model=model.name, takes_images=self._models.takes_images(model.name))
        if call.images is None:
            call.images = await fetched_images(sent, self._settings)
        return call.images

    async def _answered(
        self, job: Job, call: Call, job_of: Prepared, form: StreamForm, resolution: Resolution
    ) -> Answer:
        """The job queued (copied for its route's shadow version) and its answer relayed, named after
        the model that wrote it; its usage counts what earlier steps of the request spent too."""
        run = await self._shadow.queued(job, lambda queued: self._parts.runs.queued(queued, call.caller))
        source = run if call.spent.nothing else SpentBefore(run, call.spent)
        answer = await self._parts.relaying.answer(source, job_of.relay, stream=call.stream, form=form)
        resolution.served_by(run.served_model).label(answer)
        return answer

    async def _resumed(
        self,
        job: Job,
        call: Call,
        resume: ResumePoint,
        relay: AnswerRelay,
        form: StreamForm,
        resolution: Resolution,
    ) -> Stream:
        """The rest of a streamed answer whose client lost its connection; nothing new is queued. Only
        the key that sent the job may read it (404); it is answered by the model its job was queued
        for, whatever a route's weights say now."""
        run, earlier = await self._parts.runs.resumed(job, call.caller, resume.entry_id)
        relay.model = run.job.model
        relay.replay(earlier)
        relaying = self._parts.relaying
        answer = await stream_response(run, relay, relaying.settings, relaying.status, form)
        resolution.served_by(run.job.model).label(answer)
        return answer


def stream_form(request: Request[Any, Any, Any], resume: ResumePoint | None) -> StreamForm:
    """How a streamed answer is framed for this client (`router.intake.resume`)."""
    return StreamForm(
        event_ids=wants_event_ids(request.headers, resume), skip=resume.events_had if resume else 0
    )
