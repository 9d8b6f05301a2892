"""HTTP handlers: OpenAI endpoints and health checks. Errors are raised, never built here."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.response import Stream
from redis.exceptions import RedisError

from router.admission.auth import Caller
from router.admission.fits import check_job_fits
from router.gateway import Gateway
from router.intake.body import decode_body
from router.intake.job import chat_job, completion_job
from router.intake.resume import ResumePoint, resume_point
from router.intake.tools import plan_tools
from router.openai.chat import ChatCompletionRequest
from router.openai.checks import check_chat, check_completion
from router.openai.completions import CompletionRequest
from router.openai.errors import ServiceUnavailableError
from router.openai.models import ModelCard, ModelList
from router.relay.chat import ChatRelay
from router.relay.completions import CompletionRelay
from router.relay.first_byte import stream_response
from router.status.models import may_serve
from switchboard.readiness import NO_LIVE_WORKER, NO_WORKER_FOR_MODEL, REDIS_UNREACHABLE
from switchboard.wire import Job

_chat_request = msgspec.json.Decoder(ChatCompletionRequest)
_completion_request = msgspec.json.Decoder(CompletionRequest)
_json = msgspec.json.Encoder()
# A probe reads the worker records afresh (a worker that just started is seen at once).
READYZ_MAX_AGE_S = 0.0


def json_response(
    payload: msgspec.Struct, status_code: int = 200, headers: dict[str, str] | None = None
) -> Response[bytes]:
    """A JSON response encoded with msgspec directly (no Litestar serialization pass)."""
    return Response(
        _json.encode(payload), status_code=status_code, media_type="application/json", headers=headers
    )


@post("/v1/chat/completions", status_code=200)
async def create_chat_completion(
    request: Request[Any, Any, Any], gateway: Gateway, caller: Caller
) -> Response[bytes] | Stream:
    """OpenAI Chat Completions, streamed (server-sent events) or not."""
    chat = await decode_body(request, _chat_request)
    check_chat(chat)
    model = gateway.require_model(chat.model)
    caller.require_model(chat.model)
    tools, structured = plan_tools(chat, chat.model, model.tool_call_parser)
    job = chat_job(
        chat,
        timeout_s=gateway.settings.router.request_timeout_s,
        structured=structured,
        parse_tool_calls=tools.mode == "auto",
    )
    resume = resume_point(request.headers.get("last-event-id"), stream=chat.stream)
    if resume is not None:
        job = resume.applied_to(job)
    relay = ChatRelay(
        job_id=job.id,
        model=chat.model,
        created=int(job.created),
        n=chat.n,
        include_usage=bool(chat.stream_options and chat.stream_options.include_usage),
        logprobs=chat.logprobs,
        tools=tools,
    )
    return await _answer(gateway, caller, job, relay, stream=chat.stream, resume=resume)


@post("/v1/completions", status_code=200)
async def create_completion(
    request: Request[Any, Any, Any], gateway: Gateway, caller: Caller
) -> Response[bytes] | Stream:
    """OpenAI (legacy) Completions, streamed (server-sent events) or not."""
    completion = await decode_body(request, _completion_request)
    prompts = check_completion(completion)
    gateway.require_model(completion.model)
    caller.require_model(completion.model)
    job = completion_job(completion, timeout_s=gateway.settings.router.request_timeout_s)
    resume = resume_point(request.headers.get("last-event-id"), stream=completion.stream)
    if resume is not None:
        job = resume.applied_to(job)
    relay = CompletionRelay(
        job_id=job.id,
        model=completion.model,
        created=int(job.created),
        choices=prompts * completion.n,
        include_usage=bool(completion.stream_options and completion.stream_options.include_usage),
        logprobs=completion.logprobs is not None,
    )
    return await _answer(gateway, caller, job, relay, stream=completion.stream, resume=resume)


async def _answer(
    gateway: Gateway,
    caller: Caller,
    job: Job,
    relay: ChatRelay | CompletionRelay,
    *,
    stream: bool,
    resume: ResumePoint | None = None,
) -> Response[bytes] | Stream:
    """Admit and queue the job, and answer with its result: streamed, or whole once it has finished.
    A resumed stream queues nothing: it relays the rest of the job it names.

    A client that leaves cancels the job either way (`router.http.disconnect`).
    """
    gateway.health.require_up()
    if resume is not None:
        run, earlier = await gateway.resume_job(job, caller, resume.entry_id)
        relay.replay(earlier)
        return await stream_response(run, relay, gateway.settings.router, gateway.status)
    await check_job_fits(gateway.limits, job)
    if stream:
        run = await gateway.start_job(job, caller)
        return await stream_response(run, relay, gateway.settings.router, gateway.status)
    async with gateway.run_job(job, caller) as run:
        return json_response(await relay.assemble(run.chunks()))


@get("/v1/models")
async def list_models(gateway: Gateway, caller: Caller) -> Response[bytes]:
    """The models this front door routes that the caller's key may use."""
    names = [name for name in gateway.model_names() if caller.may_use(name)]
    return json_response(ModelList(data=[_card(gateway, name) for name in names]))


# Model names may hold slashes (`Qwen/Qwen2.5-0.5B`), so the id is the rest of the path.
@get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, gateway: Gateway, caller: Caller) -> Response[bytes]:
    """One model this front door routes, or a 404; a 403 for a model the caller's key may not use."""
    name = model_id.strip("/")
    gateway.require_model(name)
    caller.require_model(name)
    return json_response(_card(gateway, name))


def _card(gateway: Gateway, name: str) -> ModelCard:
    return ModelCard(id=name, created=int(gateway.started))


class Health(msgspec.Struct, kw_only=True):
    """Body of the health endpoints."""

    status: str
    workers: int | None = None
    # Per configured model: whether some live worker may hold it.
    models: dict[str, bool] | None = None
    time: float = msgspec.field(default_factory=time.time)


@get("/healthz")
async def healthz() -> Response[bytes]:
    """The process is up and serving HTTP."""
    return json_response(Health(status="ok"))


@get("/readyz")
async def readyz(gateway: Gateway, model: str | None = None) -> Response[bytes]:
    """Ready when Redis answers and at least one worker is alive (or without any, with
    `router.ready_without_workers`); with `?model=NAME`, when some live worker may hold that model.
    The body tells, per model, whether a live worker may hold it."""
    if not gateway.health.up:
        raise ServiceUnavailableError(
            "Redis is unreachable; the front door retries it.", code=REDIS_UNREACHABLE
        )
    try:
        records = await gateway.status.live_workers(READYZ_MAX_AGE_S)
    except RedisError as exc:
        gateway.unavailable(exc)
        raise ServiceUnavailableError(f"Redis is unreachable: {exc}", code=REDIS_UNREACHABLE) from exc
    if not records and not gateway.settings.router.ready_without_workers:
        raise ServiceUnavailableError(
            "No worker is alive yet; start one with `switchboard worker`.", code=NO_LIVE_WORKER
        )
    if model is not None:
        gateway.require_model(model)
        if not may_serve(records, model):
            raise ServiceUnavailableError(
                f"No live worker may hold the model `{model}`.", code=NO_WORKER_FOR_MODEL
            )
    models = {name: may_serve(records, name) for name in gateway.model_names()}
    return json_response(Health(status="ready", workers=len(records), models=models))
