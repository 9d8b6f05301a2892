"""HTTP handlers: OpenAI endpoints and health checks. Errors are raised, never built here."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.response import Stream
from redis.exceptions import RedisError

from router.auth import Caller
from router.enqueue import chat_job
from router.gateway import Gateway
from router.openai.chat import ChatCompletionRequest
from router.openai.errors import ServiceUnavailableError, from_validation_error
from router.openai.models import ModelCard, ModelList
from router.relay import ChatRelay
from router.streaming import stream_response
from switchboard.readiness import NO_LIVE_WORKER, REDIS_UNREACHABLE

_chat_request = msgspec.json.Decoder(ChatCompletionRequest)
_json = msgspec.json.Encoder()


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
    try:
        chat = _chat_request.decode(await request.body())
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise from_validation_error(exc) from None
    gateway.require_model(chat.model)
    job = chat_job(chat, timeout_s=gateway.settings.router.request_timeout_s)
    relay = ChatRelay(
        job_id=job.id,
        model=chat.model,
        created=int(job.created),
        include_usage=bool(chat.stream_options and chat.stream_options.include_usage),
    )
    if chat.stream:
        run = await gateway.start_job(job, caller)
        return await stream_response(run, relay, gateway.settings.router, gateway.status)
    async with gateway.run_job(job, caller) as run:
        return json_response(await relay.assemble(run.chunks()))


@get("/v1/models")
async def list_models(gateway: Gateway, caller: Caller) -> Response[bytes]:
    """The models this front door routes that the caller's key may use."""
    created = int(gateway.started)
    names = [name for name in gateway.model_names() if caller.may_use(name)]
    cards = [ModelCard(id=name, created=created) for name in names]
    return json_response(ModelList(data=cards))


class Health(msgspec.Struct, kw_only=True):
    """Body of the health endpoints."""

    status: str
    workers: int | None = None
    time: float = msgspec.field(default_factory=time.time)


@get("/healthz")
async def healthz() -> Response[bytes]:
    """The process is up and serving HTTP."""
    return json_response(Health(status="ok"))


@get("/readyz")
async def readyz(gateway: Gateway) -> Response[bytes]:
    """Ready when Redis answers and at least one worker is alive."""
    try:
        workers = await gateway.live_workers()
    except RedisError as exc:
        raise ServiceUnavailableError(f"Redis is unreachable: {exc}", code=REDIS_UNREACHABLE) from exc
    if workers == 0:
        raise ServiceUnavailableError(
            "No worker is alive yet; start one with `switchboard worker`.", code=NO_LIVE_WORKER
        )
    return json_response(Health(status="ready", workers=workers))
