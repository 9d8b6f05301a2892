"""A cascade pipeline's steps: the draft model answers first, its whole answer held until judged
(`router.routing.pipelines.cascade`); kept, it is the answer, else the strong model answers and its usage
counts what the draft spent. The request's flow (`router.flow`) runs the two in order:
`draft_step`, its answer `judged`, then, only when the draft is not kept, `escalated`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec

from router.gate.asks import CompletionAsk
from router.http.answers import Answer
from router.openai.checks import invalid
from router.openai.errors import OpenAIError
from router.queue.held_answer import HeldAnswer, collect
from router.relay.answer_relays import AnswerRelay
from router.relay.first_byte import StreamForm
from router.routing.call import Call
from router.routing.fallback import failed_on_the_model
from router.routing.pipelines.cascade import (
    DraftVerdict,
    client_chunks,
    draft_failed,
    draft_sampling,
    draft_too_slow,
    judge_draft,
)
from router.routing.pipelines.spent_tokens import usage_told
from router.routing.pipelines.step_parts import StepParts
from router.routing.pipelines.steps import (
    CASCADE_HEADER,
    DRAFT_HEADER,
    STEP_SECONDS,
    STEPS,
    Draft,
    DraftRejected,
    set_attributes,
    step_span,
)
from router.routing.resolve import PIPELINE_ATTRIBUTE, Resolution
from switchboard.config import CascadeConfig
from switchboard.wire import Job


def draft_step(
    resolution: Resolution, call: Call, config: CascadeConfig, parts: StepParts
) -> tuple[Resolution, Draft]:
    """What drafts the answer (without fallbacks: a failed draft escalates), and what its job is asked."""
    if isinstance(call.ask, CompletionAsk) and call.ask.completion.echo:
        # The echoed prompt would be judged as the draft's text and log-probabilities.
        raise invalid(
            "echo", f"The cascade {resolution.served!r} cannot echo the prompt; send `echo` without it."
        )
    return parts.step(call, config.draft, resolution.alone()), Draft(resolution.served, config)


@contextmanager
def judged(draft: Resolution, plan: Draft) -> Iterator[None]:
    """Around the draft's answer: a draft that is not kept (rejected, too slow, or failed on its
    model) ends here, counted and traced, so that what follows the `with` is the escalation."""
    verdict: DraftVerdict | None = None
    started = time.perf_counter()
    with step_span("switchboard.pipeline.draft", {PIPELINE_ATTRIBUTE: plan.pipeline}) as span:
        try:
            yield
        except DraftRejected as rejected:
            verdict, outcome = rejected.verdict, rejected.outcome
        except OpenAIError as error:
            if not failed_on_the_model(error):
                raise
            verdict, outcome = draft_failed(error.message), "failed"
        finally:
            STEP_SECONDS.labels(plan.pipeline, "draft").observe(time.perf_counter() - started)
        if verdict is None:
            return  # kept: its answer went out
        set_attributes(span, {"switchboard.draft.kept": False, "switchboard.draft.reason": verdict.reason})
    STEPS.labels(plan.pipeline, "draft", plan.model or draft.served, outcome).inc()


def escalated(
    resolution: Resolution,
    call: Call,
    config: CascadeConfig,
    draft: Resolution,
    plan: Draft,
    parts: StepParts,
) -> Resolution:
    """What answers once the draft is not kept: the strong model, its answer naming the draft."""
    drafted_by = plan.model or draft.served
    return parts.step(call, config.strong, resolution).noted(
        (CASCADE_HEADER, "escalated"), (DRAFT_HEADER, drafted_by)
    )


async def drafted(
    job: Job,
    call: Call,
    relay: AnswerRelay,
    plan: Draft,
    *,
    form: StreamForm,
    resolution: Resolution,
    parts: StepParts,
) -> Answer:
    """The draft's answer, held until judged: returned if kept, else DraftRejected (with what it
    spent, which the strong model's answer then counts)."""
    plan.model = job.model
    drafting = msgspec.structs.replace(job, sampling=draft_sampling(job.sampling))
    run = await parts.runs.queued(drafting, call.caller)
    try:
        chunks = await collect(run, plan.hold_s if call.stream else run.job.deadline - time.time())
    finally:
        await run.close()
    if chunks is None:
        raise DraftRejected(draft_too_slow(plan.hold_s), "too_slow")
    verdict = judge_draft(
        chunks,
        min_mean_logprob=plan.min_mean_logprob,
        structure=job.sampling.structured,
        length_is_normal=call.max_tokens_set,
    )
    if not verdict.accepted:
        call.spent.add(usage_told(chunks))  # the strong model's answer counts it
        raise DraftRejected(verdict, "rejected")
    STEPS.labels(plan.pipeline, "draft", job.model, "accepted").inc()
    earlier = await call.spent.settled()
    told = client_chunks(chunks, wanted_logprobs=call.wants_logprobs, extra_usage=earlier)
    held = HeldAnswer(run.job, told, served_model=run.served_model)
    answer = await parts.relaying.answer(held, relay, stream=call.stream, form=form)
    resolution.served_by(run.served_model).noted((CASCADE_HEADER, "accepted")).label(answer)
    return answer
