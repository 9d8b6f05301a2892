"""What each model accepts, as its workers published it, and the checks made with it before queueing.

A request that cannot fit the model's context (a prompt longer in characters than any text of
max_model_len tokens can be, or max_tokens beyond the context) is refused here, before it is queued
or tokenized anywhere. A chat's prompt counts what its template certainly renders
(`context_length.least_chat_chars`): its messages' text and, where the model's template renders
tools, its tool calls and tools; never more, so that nothing that could fit is refused. Limits are
known once the model has been loaded anywhere; until then, the worker makes the same checks (and
its answer is still a 400 before the first byte).
"""

from __future__ import annotations

import time
from typing import cast

import redis.asyncio as aioredis

from router.openai.errors import InvalidRequestError, ModelTakesNoImagesError
from switchboard import context_length, keys
from switchboard.wire import Job, ModelLimits, PoolingTask, model_limits_decoder

# Limits change only when a model's configuration does; a few seconds of staleness costs nothing.
CACHE_S = 10.0


class ModelLimitsCache:
    """Each model's published limits, read from Redis at most every CACHE_S seconds."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._cached: dict[str, tuple[float, ModelLimits | None]] = {}

    async def get(self, model: str) -> ModelLimits | None:
        """The model's limits, or None if no worker has loaded it yet."""
        now = time.monotonic()
        cached = self._cached.get(model)
        if cached is not None and now - cached[0] < CACHE_S:
            return cached[1]
        raw = cast(bytes | None, await self._redis.get(keys.model_limits(model)))
        limits = model_limits_decoder.decode(raw) if raw is not None else None
        self._cached[model] = (now, limits)
        return limits


class RequestSize:
    """What a request asks of a model's context, as far as the front door can tell without tokenizing."""

    def __init__(
        self,
        *,
        prompt_param: str,
        prompt_chars: int,
        prompt_text_of: str | None = None,
        max_tokens: int | None,
        prompt_tokens: int = 0,
        token_ids: list[int] | None = None,
        logit_bias: dict[int, float] | None = None,
    ) -> None:
        self.prompt_param = prompt_param
        # The longest prompt, in characters (at most what it will hold), and (prompts given as token
        # ids) in tokens; the request's parts the characters were counted from, if more than the param.
        self.prompt_chars = prompt_chars
        self.prompt_text_of = prompt_text_of
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.token_ids = token_ids or []
        self.logit_bias = logit_bias or {}


def size_of(job: Job, *, template_renders_tools: bool = False) -> RequestSize:
    """What `job` asks of its model's context; `template_renders_tools`: whether the model's chat
    template renders tools and tool calls (a model with a tool-call parser)."""
    sampling = job.sampling
    if job.messages is not None:
        counts_tools = template_renders_tools and (
            bool(job.tools) or any(message.tool_calls for message in job.messages)
        )
        chars = context_length.least_chat_chars(
            job.messages, job.tools, template_renders_tools=template_renders_tools
        )
        return RequestSize(
            prompt_param="messages",
            prompt_chars=chars,
            prompt_text_of="`messages` and `tools`" if counts_tools else None,
            max_tokens=sampling.max_tokens,
            logit_bias=sampling.logit_bias,
        )
    texts = [p for p in job.prompts or () if isinstance(p, str)]
    token_prompts = [p for p in job.prompts or () if not isinstance(p, str)]
    return RequestSize(
        prompt_param="prompt",
        prompt_chars=max((len(text) for text in texts), default=0),
        prompt_tokens=max((len(ids) for ids in token_prompts), default=0),
        max_tokens=sampling.max_tokens,
        token_ids=[token for ids in token_prompts for token in ids],
        logit_bias=sampling.logit_bias,
    )


async def check_job_fits(cache: ModelLimitsCache, job: Job, *, template_renders_tools: bool = False) -> None:
    """Refuse (400) a job that cannot fit its model, where the model's limits are known;
    `template_renders_tools` as for `size_of`."""
    limits = await cache.get(job.model)
    if limits is not None:
        check_images_fit(limits, job)
        check_fits(limits, size_of(job, template_renders_tools=template_renders_tools))


def check_images_fit(limits: ModelLimits, job: Job) -> None:
    """Refuse (400) images to a model whose workers say it takes none, and images that take the whole
    context (or the context with `max_tokens`) by the fewest tokens the model makes of one."""
    count = len(job.images)
    if not count:
        return
    if limits.min_image_tokens is None:
        raise ModelTakesNoImagesError(job.model)
    least = count * limits.min_image_tokens
    max_tokens = job.sampling.max_tokens or 1
    context = limits.max_model_len
    if least + max_tokens > context:
        raise InvalidRequestError(
            f"This model's maximum context length is {context} tokens, and the request's {count} "
            f"images take at least {least} tokens, which leaves no room for a completion of "
            f"{max_tokens} tokens. Send fewer images, or lower max_tokens.",
            param="messages",
            code=context_length.CONTEXT_LENGTH_EXCEEDED,
        )


async def check_pooling_fits(cache: ModelLimitsCache, task: PoolingTask, model: str, param: str) -> None:
    """Refuse (400) a pooling job's input that cannot fit its model, where the model's limits are
    known: text longer than any text of its context, token ids beyond its context or vocabulary.
    A job that asks for truncation is let through, its inputs cut to fit, unless it asks to keep
    more tokens than the model takes."""
    limits = await cache.get(model)
    if limits is None:
        return
    _check_dimensions(task, limits, model)
    if task.truncate_prompt_tokens is not None:
        _check_kept_tokens(task.truncate_prompt_tokens, limits)
        return
    query = len(task.query) if task.query is not None else 0
    texts = [len(text) + query for text in task.inputs if isinstance(text, str)]
    refusal = context_length.text_refusal(limits, max(texts, default=0), param)
    if refusal is not None:
        raise InvalidRequestError(refusal.message, param=refusal.param, code=refusal.code)
    token_inputs = [ids for ids in task.inputs if not isinstance(ids, str)]
    longest = max((len(ids) for ids in token_inputs), default=0)
    if longest > limits.max_model_len:
        raise InvalidRequestError(
            f"This model's maximum context length is {limits.max_model_len} tokens, and an input of "
            f"`{param}` takes {longest} tokens. Shorten it, or set `truncate_prompt_tokens`.",
            param=param,
            code=context_length.CONTEXT_LENGTH_EXCEEDED,
        )
    _check_tokens([token for ids in token_inputs for token in ids], limits, param)


def _check_kept_tokens(truncate_prompt_tokens: int, limits: ModelLimits) -> None:
    """Refuse (400) keeping more tokens than the model's context (the worker would, after a hop)."""
    context = limits.max_model_len
    if truncate_prompt_tokens > context:
        raise InvalidRequestError(
            f"`truncate_prompt_tokens` must be -1 or from 1 to the model's maximum context length "
            f"({context} tokens); it is {truncate_prompt_tokens}.",
            param="truncate_prompt_tokens",
            code="invalid_value",
        )


def _check_dimensions(task: PoolingTask, limits: ModelLimits, model: str) -> None:
    """Refuse (400) `dimensions` above the embedder's vector size (the worker would, after a hop)."""
    size = limits.embedding_size
    if task.dimensions is not None and size is not None and task.dimensions > size:
        raise InvalidRequestError(
            f"{model} makes embeddings of {size} dimensions; `dimensions` cannot ask for more "
            f"({task.dimensions}).",
            param="dimensions",
            code="invalid_value",
        )


def check_fits(limits: ModelLimits, size: RequestSize) -> None:
    """Refuse (400) what cannot fit `limits`, naming the parameter at fault."""
    refusals = (
        context_length.text_refusal(
            limits, size.prompt_chars, size.prompt_param, text_of=size.prompt_text_of
        ),
        context_length.prompt_refusal(limits, size.prompt_tokens, size.prompt_param),
        context_length.completion_refusal(limits, size.max_tokens, size.prompt_param, prompt_tokens=None),
    )
    for refusal in refusals:
        if refusal is not None:
            raise InvalidRequestError(refusal.message, param=refusal.param, code=refusal.code)
    _check_tokens(size.token_ids, limits, size.prompt_param)
    _check_tokens(list(size.logit_bias), limits, "logit_bias")


def _check_tokens(token_ids: list[int], limits: ModelLimits, param: str) -> None:
    outside = sorted({token for token in token_ids if token >= limits.vocab_size})
    if outside:
        raise InvalidRequestError(
            f"`{param}` holds token ids outside the model's vocabulary (0 to {limits.vocab_size - 1}): "
            f"{outside[:5]}.",
            param=param,
            code="invalid_value",
        )
