"""An ask as the job its served model runs and the relay that turns the job's chunks into the
client's answer: one function for every kind of generation request, so that the request's flow
(`router.flow`) runs the same steps for a chat completion, a completion and a response."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from router.gate.asks import ChatAsk, GenerationAsk, ResponsesAsk
from router.intake.job import chat_job, completion_job, tier_of
from router.intake.tools import plan_tools
from router.relay.answer_relays import AnswerRelay
from router.relay.chat import chat_relay
from router.relay.completions import completion_relay
from router.relay.responses import responses_relay
from switchboard.config import ModelConfig
from switchboard.wire import ImageInput, Job, Tier


@dataclass(frozen=True, slots=True)
class Prepared:
    job: Job
    relay: AnswerRelay
    # A model with a tool-call parser has a template that renders tools (`least_chat_chars`).
    template_renders_tools: bool = False


def prepared(
    ask: GenerationAsk,
    model: ModelConfig,
    *,
    timeout_s: float,
    job_id: str | None,
    owner: str,
    as_queued: Callable[[Job], Job] = lambda job: job,
    images: tuple[ImageInput, ...] = (),
    tier: Tier | None = None,
) -> Prepared:
    """The job `model` runs for `ask` (as job `job_id`, then `as_queued`: the route it came through,
    a resumed job's id) for the key whose identity is `owner` (its prefix-cache salt), with the
    chat's `images` (fetched for `model`), in `tier` (None: the one its `service_tier` asks for), and
    the relay of its answer, which names that job."""
    if isinstance(ask, ChatAsk):
        chat = msgspec.structs.replace(ask.chat, model=model.name)
        tools, structured = plan_tools(chat, chat.model, model.tool_call_parser)
        made = chat_job(
            chat,
            timeout_s=timeout_s,
            structured=structured,
            parse_tool_calls=tools.mode == "auto",
            job_id=job_id,
            owner=owner,
            images=images,
            tier=tier or tier_of(chat.service_tier),
        )
        job = as_queued(made)
        if isinstance(ask, ResponsesAsk):
            relay: AnswerRelay = responses_relay(
                ask.responses, job, tools, model=chat.model, logprobs=chat.logprobs
            )
        else:
            relay = chat_relay(chat, job, tools)
        return Prepared(job, relay, template_renders_tools=model.tool_call_parser is not None)
    completion = msgspec.structs.replace(ask.completion, model=model.name)
    made = completion_job(completion, timeout_s=timeout_s, job_id=job_id, owner=owner, tier=tier or "default")
    job = as_queued(made)
    return Prepared(job, completion_relay(completion, job, ask.prompts))
