"""Validated OpenAI requests into Jobs: the product's own schema, which is all a worker sees.

Every generation job carries its key's prefix-cache salt (`cache_salt`): an engine's prefix cache
reuses the blocks of any earlier prompt with the same beginning, so without it one key could time
its own requests to learn what another key's prompts begin with. Requests of one key still share
their prefixes; with keys off there is one shared cache.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import msgspec

from router.openai.chat import ChatCompletionRequest, ChatMessageIn, JsonObjectFormat, JsonSchemaFormat
from router.openai.checks import logit_bias_tokens
from router.openai.common import SamplingRequest, stop_list
from router.openai.completions import CompletionRequest
from switchboard.job_ids import created_of, new_job_id
from switchboard.kept_text import front_door_cut
from switchboard.wire import (
    ChatMessage,
    ImageInput,
    Job,
    PoolingTask,
    Prompt,
    SamplingParams,
    StructuredOutput,
    Tier,
    ToolCall,
)

_json = msgspec.json.Encoder()


# A job id is 32 hex digits: its creation time in milliseconds (12), then 80 random bits (20).
# The time is in it so that a resumed stream (`router.intake.resume`) repeats the answer's `created`.


# What a key's salt is derived from besides the key's identity, so that it is no other digest of it.
_SALT_DOMAIN = b"switchboard prefix-cache salt\0"
# 128 bits of the digest: no two keys meet by chance.
KEY_SALT_CHARS = 32


def cache_salt(owner: str, client_salt: str | None = None) -> str | None:
    """The prefix-cache salt of a job sent by the key whose identity is `owner` (`Caller.owner`, its
    SHA-256; "" with keys off): a digest of it, then the client's own salt, if it gave one, as a
    suffix. The key's part comes first at a fixed length, so no suffix makes another key's salt.
    With keys off, the client's salt alone (vLLM's own behaviour)."""
    if not owner:
        return client_salt
    key_salt = hashlib.sha256(_SALT_DOMAIN + owner.encode()).hexdigest()[:KEY_SALT_CHARS]
    return key_salt if client_salt is None else f"{key_salt}:{client_salt}"


def tier_of(service_tier: str | None) -> Tier:
    """The tier a request's `service_tier` asks for: auto (and none) is default."""
    return "flex" if service_tier == "flex" else "priority" if service_tier == "priority" else "default"


def chat_job(
    request: ChatCompletionRequest,
    *,
    timeout_s: float,
    job_id: str | None = None,
    structured: StructuredOutput | None = None,
    parse_tool_calls: bool = False,
    tenant: str | None = None,
    owner: str = "",
    images: tuple[ImageInput, ...] = (),
    tier: Tier = "default",
) -> Job:
    """The job for a chat completion; `structured` is what its tool choice needs, if anything, and
    `parse_tool_calls` whether the model's own tool calls are to be parsed from its text; `job_id`,
    the request's own id (`router.telemetry.requests`), made at its arrival; `owner`, the identity
    of the caller's key (`Caller.owner`), whose prefix-cache salt it takes (`cache_salt`); `images`,
    those of the request's image parts in their order (`router.intake.request_images`); `tier`, the
    line it waits in (`tier_of` its `service_tier`, or a batch's)."""
    top_logprobs = request.top_logprobs or 0
    sampling = sampling_params(
        request,
        max_tokens=request.max_completion_tokens or request.max_tokens,
        logprobs=top_logprobs if request.logprobs else None,
        structured=structured or _response_format(request) or _structured_outputs(request),
    )
    tools = _json.encode([tool for tool in request.tools]).decode() if request.tools else None
    return _job(
        request.model,
        sampling,
        timeout_s=timeout_s,
        job_id=job_id,
        tenant=tenant,
        messages=_messages(request.messages, with_images=bool(images)),
        images=images,
        tools=tools,
        parse_tool_calls=parse_tool_calls,
        cache_salt=cache_salt(owner, request.cache_salt),
        tier=tier,
    )


def completion_job(
    request: CompletionRequest,
    *,
    timeout_s: float,
    job_id: str | None = None,
    tenant: str | None = None,
    owner: str = "",
    tier: Tier = "default",
) -> Job:
    """The job for a plain completion (its prompt already checked by `check_completion`); `job_id`,
    `owner` and `tier` as for `chat_job`."""
    sampling = sampling_params(
        request,
        max_tokens=request.max_tokens,
        logprobs=request.logprobs,
        echo=request.echo,
        structured=_structured_outputs(request),
    )
    return _job(
        request.model,
        sampling,
        timeout_s=timeout_s,
        job_id=job_id,
        tenant=tenant,
        prompts=prompts_of(request.prompt),
        cache_salt=cache_salt(owner, request.cache_salt),
        tier=tier,
    )


def pooling_job(model: str, task: PoolingTask, *, timeout_s: float, job_id: str | None = None) -> Job:
    """The job of an embeddings, classification or rerank request (its inputs already checked);
    `job_id` as for `chat_job`. Nothing is sampled: its sampling parameters are the defaults. Texts
    of a job that keeps only its inputs' last tokens travel cut to what those can span."""
    pooling = front_door_cut(task)
    return _job(model, SamplingParams(), timeout_s=timeout_s, job_id=job_id, tenant=None, pooling=pooling)


def prompts_of(prompt: str | list[Any]) -> tuple[Prompt, ...]:
    """The prompts of a completion request, in OpenAI's order."""
    if isinstance(prompt, str):
        return (prompt,)
    if all(isinstance(item, int) for item in prompt):
        return (tuple(prompt),)
    return tuple(item if isinstance(item, str) else tuple(item) for item in prompt)


def sampling_params(
    request: SamplingRequest,
    *,
    max_tokens: int | None,
    logprobs: int | None,
    echo: bool = False,
    structured: StructuredOutput | None = None,
) -> SamplingParams:
    """What the engine samples with, from the fields every generation request shares."""
    temperature = request.temperature
    # top_p == 0 keeps only the most likely token: that is greedy sampling, which the engines
    # express as temperature 0 (they refuse top_p == 0 itself).
    top_p = request.top_p
    if top_p == 0:
        temperature, top_p = 0.0, None
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=request.top_k,
        min_p=request.min_p,
        seed=request.seed,
        stop=stop_list(request.stop),
        n=request.n,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        repetition_penalty=request.repetition_penalty,
        min_tokens=request.min_tokens,
        logit_bias=logit_bias_tokens(request.logit_bias),
        logprobs=logprobs,
        echo=echo,
        structured=structured,
    )


def _job(
    model: str,
    sampling: SamplingParams,
    *,
    timeout_s: float,
    job_id: str | None,
    tenant: str | None,
    **inputs: Any,
) -> Job:
    # An id made earlier tells when: the job was made then, as far as its `created` goes.
    now = created_of(job_id) if job_id is not None else time.time()
    return Job(
        id=job_id or new_job_id(now),
        model=model,
        sampling=sampling,
        created=now,
        deadline=now + timeout_s,
        tenant=tenant,
        **inputs,
    )


def _messages(messages: list[ChatMessageIn], *, with_images: bool) -> tuple[ChatMessage, ...]:
    """The conversation as the job carries it; a message with image parts also in `parts`, each image
    named by its index among the request's images (counted in the order of messages and parts)."""
    if not with_images:
        return tuple(_message(message) for message in messages)
    images_before = 0
    carried = []
    for message in messages:
        parts = _parts(message, images_before)
        images_before += sum(isinstance(part, int) for part in parts)
        carried.append(msgspec.structs.replace(_message(message), parts=parts))
    return tuple(carried)


def _parts(message: ChatMessageIn, images_before: int) -> tuple[str | int, ...]:
    """A message's content in order, its images as indices from `images_before` on; () for a
    message without images (its `content` says it all)."""
    if not isinstance(message.content, list) or not any(p.type == "image_url" for p in message.content):
        return ()
    parts: list[str | int] = []
    for part in message.content:
        if part.type == "image_url":
            parts.append(images_before)
            images_before += 1
        elif part.text or part.refusal:
            parts.append(part.text or part.refusal or "")
    return tuple(parts)


def _message(message: ChatMessageIn) -> ChatMessage:
    calls = tuple(
        ToolCall(id=call.id, name=call.function.name, arguments=call.function.arguments)
        for call in message.tool_calls or ()
    )
    return ChatMessage(
        role=message.role,
        content=None if message.content is None else message.text(),
        name=message.name,
        tool_calls=calls,
        tool_call_id=message.tool_call_id,
    )


def _response_format(request: ChatCompletionRequest) -> StructuredOutput | None:
    response_format = request.response_format
    if isinstance(response_format, JsonObjectFormat):
        return StructuredOutput(json_object=True)
    if isinstance(response_format, JsonSchemaFormat):
        schema = response_format.json_schema.schema or {"type": "object"}
        return StructuredOutput(json_schema=_json.encode(schema).decode())
    return None


def _structured_outputs(request: SamplingRequest) -> StructuredOutput | None:
    """vLLM's `structured_outputs` extension (its one constraint checked by `check_chat`/`check_completion`)."""
    constraints = request.structured_outputs
    if constraints is None:
        return None
    return StructuredOutput(
        json_schema=_json.encode(constraints.json).decode() if constraints.json is not None else None,
        json_object=bool(constraints.json_object),
        regex=constraints.regex,
        choice=tuple(constraints.choice) if constraints.choice is not None else None,
        grammar=constraints.grammar,
    )


def step_job(
    model: str,
    messages: tuple[ChatMessage, ...],
    sampling: SamplingParams,
    *,
    timeout_s: float,
    owner: str = "",
) -> Job:
    """A job a pipeline's step asks of a model on the request's behalf (a router's choice), with an
    id of its own; `owner` as for `chat_job` (the router reads the request's text)."""
    return _job(
        model,
        sampling,
        timeout_s=timeout_s,
        job_id=None,
        tenant=None,
        messages=messages,
        cache_salt=cache_salt(owner),
    )
