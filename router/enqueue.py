"""Turn a validated request into a Job and put it on its model's stream in one round trip."""

from __future__ import annotations

import time
import uuid

import redis.asyncio as aioredis

from router.openai.chat import ChatCompletionRequest
from router.openai.common import stop_list
from switchboard import keys
from switchboard.wire import ChatMessage, Job, SamplingParams, encode


def new_job_id() -> str:
    """A unique id, also used as the OpenAI response id's suffix."""
    return uuid.uuid4().hex


def chat_job(request: ChatCompletionRequest, *, timeout_s: float, tenant: str | None = None) -> Job:
    """The job for a chat completion request."""
    now = time.time()
    return Job(
        id=new_job_id(),
        model=request.model,
        messages=tuple(ChatMessage(role=m.role, content=m.text()) for m in request.messages),
        sampling=_sampling(request),
        created=now,
        deadline=now + timeout_s,
        tenant=tenant,
    )


def _sampling(request: ChatCompletionRequest) -> SamplingParams:
    temperature = request.temperature
    # top_p == 0 keeps only the most likely token: that is greedy sampling, which the engines
    # express as temperature 0 (they refuse top_p == 0 itself).
    top_p = request.top_p
    if top_p == 0:
        temperature, top_p = 0.0, None
    return SamplingParams(
        max_tokens=request.max_completion_tokens or request.max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=request.seed,
        stop=stop_list(request.stop),
    )


class JobQueue:
    """The front door's side of the job streams."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    async def submit(self, job: Job, *, wake_stream: str | None = None) -> None:
        """Append the job to its model's stream; poke `wake_stream` in the same round trip."""
        stream = keys.job_stream(job.model)
        pipe = self._redis.pipeline(transaction=False)
        pipe.xadd(stream, {"job": encode(job)})
        pipe.expire(stream, keys.JOB_STREAM_TTL_S)
        if wake_stream is not None:
            pipe.xadd(wake_stream, {"w": b""}, maxlen=1, approximate=False)
            pipe.expire(wake_stream, keys.WAKE_TTL_S)
        await pipe.execute()

    async def cancel(self, job_id: str) -> None:
        """Leave a cancel mark: the worker running the job stops generating for it."""
        await self._redis.set(keys.cancel_mark(job_id), b"1", ex=keys.CANCEL_TTL_S)
