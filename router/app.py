"""The front door's Litestar application factory, used by the CLI, the tests and the container."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar, Request, Response
from litestar.datastructures import State
from litestar.di import Provide
from litestar.exceptions import HTTPException, MethodNotAllowedException, NotFoundException
from redis.exceptions import RedisError

from router.admission.auth import authenticate, provide_caller
from router.endpoints import batches, files, health, v1
from router.endpoints.admin import admin_router
from router.endpoints.metrics import metrics
from router.endpoints.pooling import classify, create_embeddings, rerank
from router.front_door import FrontDoor
from router.gate import GatedRequest
from router.http.answers import json_response
from router.http.disconnect import cancel_on_disconnect
from router.http.local_pages import local_pages_only
from router.openai.errors import (
    ClientClosedRequestError,
    InvalidRequestError,
    MethodNotAllowedError,
    OpenAIError,
    RouteNotFoundError,
)
from router.telemetry.requests import client_left, current_request, observe_requests, unmatched_request_id
from router.telemetry.summarized_log import SummarizedLog
from switchboard.config import Settings

logger = logging.getLogger(__name__)
# Clients leave all the time (and an attacker at will): a line now and then, not one each.
_departures = SummarizedLog(logger, level=logging.INFO)

# The parts of the front door (`FrontDoor`'s attributes) that handlers may ask for by name.
PARTS = (
    "settings",
    "redis",
    "models",
    "routes",
    "pipelines",
    "adapters",
    "health",
    "status",
    "limits",
    "runs",
    "reader",
    "flow",
    "pooling",
    "files",
    "batches",
)


def create_app(settings: Settings) -> Litestar:
    """A front door for `settings`; it connects to Redis when it starts, not before."""

    @asynccontextmanager
    async def front_door_lifespan(app: Litestar) -> AsyncIterator[None]:
        app.state.front_door = await FrontDoor.open(settings)
        try:
            yield
        finally:
            await app.state.front_door.close()

    return Litestar(
        # Logging belongs to the process (`switchboard.logs`): Litestar's default would add its own
        # queue handler and format to the root logger, once per app.
        logging_config=None,
        request_max_body_size=settings.router.max_body_bytes,
        route_handlers=[
            v1.create_chat_completion,
            v1.create_completion,
            v1.create_response,
            v1.stored_response,
            v1.list_models,
            v1.retrieve_model,
            create_embeddings,
            classify,
            rerank,
            files.upload_file,
            files.list_files,
            files.retrieve_file,
            files.file_content,
            files.delete_file,
            batches.create_batch,
            batches.retrieve_batch,
            batches.list_batches,
            batches.cancel_batch,
            health.healthz,
            health.readyz,
            metrics,
            admin_router(),
        ],
        lifespan=[front_door_lifespan],
        # Without any key, only this machine's names and pages are answered (router.http.local_pages);
        # every route needs a known API key while auth is on (router.admission.auth), but the health
        # checks and the metrics.
        guards=[local_pages_only, authenticate],
        # Outermost, so that the request's span and timings cover everything else.
        middleware=[observe_requests, cancel_on_disconnect],
        dependencies={
            **{part: Provide(_provider(part), sync_to_thread=False) for part in PARTS},
            "caller": Provide(provide_caller),
        },
        exception_handlers={
            OpenAIError: _openai_error,
            HTTPException: _http_error,
            RedisError: _redis_error,
            Exception: _unexpected_error,
        },
        openapi_config=None,
        # A body is read only through its route's gate (`router.gate`).
        request_class=GatedRequest,
    )


def _provider(part: str) -> Callable[[State], Any]:
    def provide(state: State) -> Any:
        return getattr(state.front_door, part)

    return provide


def _openai_error(_: Request[Any, Any, Any], exc: OpenAIError) -> Response[bytes]:
    headers = {**exc.headers, **unmatched_request_id()}
    return json_response(exc.body(), status_code=exc.status_code, headers=headers)


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    error: OpenAIError
    if client_left(request.scope):
        return _client_gone(request, exc)
    if isinstance(exc, NotFoundException):
        error = RouteNotFoundError(f"No endpoint {request.method} {request.url.path}.")
    elif isinstance(exc, MethodNotAllowedException):
        error = MethodNotAllowedError(f"{request.method} is not allowed on {request.url.path}.")
    elif exc.status_code < 500:
        error = InvalidRequestError(exc.detail)
        error.status_code = exc.status_code
    else:
        error = OpenAIError(exc.detail)
        error.status_code = exc.status_code
    return _openai_error(request, error)


def _client_gone(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    """The client left while its request was read or handled: a 499 that nobody receives (what it
    broke, such as the body being read, is not the server's failure)."""
    _departures.event(
        "client_left",
        "clients left before their answers (499)",
        path=request.url.path,
        error=str(exc) or type(exc).__name__,
    )
    return _openai_error(request, ClientClosedRequestError("The client closed the request."))


def _redis_error(request: Request[Any, Any, Any], exc: RedisError) -> Response[bytes]:
    # The client gets a generic 503; where Redis is and what it said are for this log only.
    observed = current_request()
    logger.warning(
        "redis error",
        extra={
            "path": request.url.path,
            "job_id": observed.job_id if observed else "",
            "error": str(exc) or type(exc).__name__,
        },
    )
    front_door: FrontDoor = request.app.state.front_door
    return _openai_error(request, front_door.health.unavailable(exc))


def _unexpected_error(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    if client_left(request.scope):
        return _client_gone(request, exc)
    logger.exception("unhandled error", exc_info=exc, extra={"path": request.url.path})
    return _openai_error(request, OpenAIError("The server had an error while processing your request."))
