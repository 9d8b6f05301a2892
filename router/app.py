"""The front door's Litestar application factory, used by the CLI, the tests and the container."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar, Request, Response
from litestar.datastructures import State
from litestar.di import Provide
from litestar.exceptions import HTTPException, MethodNotAllowedException, NotFoundException
from redis.exceptions import RedisError

from router.admission.auth import authenticate, provide_caller
from router.admission.limits import REDIS_FULL_RETRY_S, is_redis_full
from router.endpoints import v1 as routes
from router.endpoints.admin import admin_router
from router.endpoints.metrics import metrics
from router.gateway import Gateway
from router.http.disconnect import cancel_on_disconnect
from router.openai.errors import (
    InvalidRequestError,
    MethodNotAllowedError,
    OpenAIError,
    RedisFullError,
    RouteNotFoundError,
    ServiceUnavailableError,
)
from router.telemetry.requests import observe_requests
from switchboard.config import Settings

logger = logging.getLogger(__name__)


def create_app(settings: Settings) -> Litestar:
    """A front door for `settings`; it connects to Redis when it starts, not before."""

    @asynccontextmanager
    async def gateway_lifespan(app: Litestar) -> AsyncIterator[None]:
        app.state.gateway = await Gateway.open(settings)
        try:
            yield
        finally:
            await app.state.gateway.close()

    return Litestar(
        # Logging belongs to the process (`switchboard.logs`): Litestar's default would add its own
        # queue handler and format to the root logger, once per app.
        logging_config=None,
        request_max_body_size=settings.router.max_body_bytes,
        route_handlers=[
            routes.create_chat_completion,
            routes.create_completion,
            routes.list_models,
            routes.retrieve_model,
            routes.healthz,
            routes.readyz,
            metrics,
            admin_router(),
        ],
        lifespan=[gateway_lifespan],
        # Every route needs a known API key while auth is on (router.admission.auth), but the health checks and
        # the metrics.
        guards=[authenticate],
        # Outermost, so that the request's span and timings cover everything else.
        middleware=[observe_requests, cancel_on_disconnect],
        dependencies={
            "gateway": Provide(_provide_gateway, sync_to_thread=False),
            "caller": Provide(provide_caller),
        },
        exception_handlers={
            OpenAIError: _openai_error,
            HTTPException: _http_error,
            RedisError: _redis_error,
            Exception: _unexpected_error,
        },
        openapi_config=None,
    )


def _provide_gateway(state: State) -> Gateway:
    gateway: Gateway = state.gateway
    return gateway


def _openai_error(_: Request[Any, Any, Any], exc: OpenAIError) -> Response[bytes]:
    return routes.json_response(exc.body(), status_code=exc.status_code, headers=exc.headers)


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    error: OpenAIError
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


def _redis_error(request: Request[Any, Any, Any], exc: RedisError) -> Response[bytes]:
    logger.warning("redis error", extra={"path": request.url.path, "error": str(exc)})
    gateway: Gateway | None = getattr(request.app.state, "gateway", None)
    if gateway is not None:
        return _openai_error(request, gateway.unavailable(exc))
    if is_redis_full(exc):
        return _openai_error(request, RedisFullError(REDIS_FULL_RETRY_S))
    return _openai_error(request, ServiceUnavailableError(f"Redis is unavailable: {exc}. Retry shortly."))


def _unexpected_error(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    logger.exception("unhandled error", exc_info=exc, extra={"path": request.url.path})
    return _openai_error(request, OpenAIError("The server had an error while processing your request."))
