"""A router pipeline's step: its router model reads the request and chooses the target that answers
(`router.routing.pipelines.router_model`); the default target stays the fallback of any other choice.

The router's job is queued under the caller's key (its tokens are the request's; should its model
refuse it, the router route's stable version is asked), and its chunks are read as they come:
once the label is known, the job is stopped and its end read in the background, for its usage.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

from redis.exceptions import RedisError

from router.gate.asks import ChatAsk, GenerationAsk
from router.intake.job import step_job
from router.openai.errors import OpenAIError
from router.queue.run import JobRun
from router.routing.call import Call
from router.routing.fallback import failed_on_the_model
from router.routing.pipelines.router_model import AskRouter, choose, request_text
from router.routing.pipelines.step_parts import StepParts
from router.routing.pipelines.steps import (
    CHOICE_HEADER,
    ROUTER_HEADER,
    STEP_SECONDS,
    STEPS,
    choice_attributes,
    set_attributes,
    step_span,
)
from router.routing.pipelines.warm_targets import WarmTargets
from router.routing.resolve import PIPELINE_ATTRIBUTE, Resolution
from switchboard.config import RouterModelConfig
from switchboard.wire import ChatMessage, Chunk, SamplingParams, Usage

# How long the end of a router's job stopped early is waited for (its usage).
STOPPED_END_S = 5.0


async def routed(
    resolution: Resolution, call: Call, config: RouterModelConfig, parts: StepParts
) -> Resolution:
    """What answers `call`: the target the router model chooses, with the default target after it."""
    pipeline = resolution.served
    router = parts.step(call, config.model, resolution.alone())
    targets = {t.model: parts.step(call, t.model, resolution) for t in config.targets.values()}
    warm = WarmTargets(parts.status, targets, parts.pipelines)
    started = time.perf_counter()
    attributes = {PIPELINE_ATTRIBUTE: pipeline, "switchboard.router.model": router.served}
    with step_span("switchboard.pipeline.router", attributes) as span:
        try:
            text = _text_of(call.ask, config.request_chars)
            choice = await choose(config, text, _asker(router, call, parts), warm.is_warm)
        finally:
            warm.close()
        set_attributes(span, choice_attributes(choice))
    STEP_SECONDS.labels(pipeline, "router").observe(time.perf_counter() - started)
    STEPS.labels(pipeline, "router", router.served, choice.chosen_by).inc()
    call.spent.add(choice.usage)
    how = choice.label if choice.chosen_by == "router" else f"{choice.label}; {choice.chosen_by}"
    chosen = parts.step(call, choice.target, resolution).noted(
        (ROUTER_HEADER, router.served), (CHOICE_HEADER, how)
    )
    default = config.targets[config.default].model
    if choice.target != default:
        fallback = parts.step(call, default, resolution)
        chosen = chosen.then((fallback.served, fallback.route), *fallback.later)
    return chosen


def _text_of(ask: GenerationAsk, limit: int) -> str:
    """What the router model reads of the request (`request_text`)."""
    if isinstance(ask, ChatAsk):
        messages = [
            ChatMessage(role=m.role, content=None if m.content is None else m.text())
            for m in ask.chat.messages
        ]
        return request_text(messages, None, limit)
    prompt = ask.completion.prompt
    return request_text(None, prompt if isinstance(prompt, str) else str(prompt), limit)


def _asker(router: Resolution, call: Call, parts: StepParts) -> AskRouter:
    """How the router's job is run for `call`: its chunks yielded as they come; closed before the
    job's end (its label was known), the job is stopped and its end read in the background."""

    async def ask(messages: tuple[ChatMessage, ...], sampling: SamplingParams) -> AsyncGenerator[Chunk, None]:
        run = await _router_run(router, messages, sampling, call, parts)
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
    router: Resolution,
    messages: tuple[ChatMessage, ...],
    sampling: SamplingParams,
    call: Call,
    parts: StepParts,
) -> JobRun:
    attempt: Resolution | None = router
    while True:
        assert attempt is not None
        job = step_job(attempt.served, messages, sampling, timeout_s=parts.timeout_s, owner=call.caller.owner)
        parts.health.require_up()
        try:
            return await parts.runs.queued(job, call.caller)
        except OpenAIError as error:
            if not failed_on_the_model(error) or attempt.fallback() is None:
                raise
        attempt = attempt.fallback()


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
