"""Every API request, seen from outside the app: its id, its HTTP span, its status and its timings.

An ASGI middleware around the whole app. Every response carries `x-request-id`: the id of the
request's job once it has one (the id an operator finds in logs and traces, and the one a client
resumes a stream with, `router.intake.resume`), else one made for the request. A client's own
`x-request-id` (short and printable, else ignored) is not echoed, as OpenAI's API does not: it is
kept as the trace's correlation id (`switchboard.client_request_id`) and in every log line of the
request, beside `request_id`. It continues an incoming W3C `traceparent` (or starts a
trace) with one server span that lasts to the response's last byte, and counts the request by model
and status once it has ended. What happens inside (the job's spans, the first chunk) is recorded by
`router.telemetry.job_observer` on the request's `RequestObservation`, found through a context variable that
the handler's task inherits.
"""

from __future__ import annotations

import contextvars
import re
import time
from dataclasses import dataclass, field
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from router.telemetry.front_door_metrics import E2E_LATENCY, OPERATION_REQUESTS, REQUESTS
from switchboard import tracing
from switchboard.job_ids import new_job_id

# Requests under these paths are observed; /metrics and the health checks are not. vLLM serves
# its classification and rerank APIs outside /v1/ (`router.endpoints.pooling`).
OBSERVED_PREFIXES = ("/v1/", "/v2/", "/classify", "/rerank")
# The model lookup's path holds the model's name: its span is named after the route instead.
MODELS_ROUTE = "/v1/models"
# nginx's "client closed request": the client left before its response's last byte.
CLIENT_CLOSED = 499
# The scope's key for that (set by `router.http.disconnect`, which hears the client leave).
_CLIENT_LEFT = "switchboard.client_left"
REQUEST_ID_HEADER = b"x-request-id"
# A client's own request id is kept if it is this short and printable (no spaces, no controls).
_CLIENT_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")


def new_request_id() -> str:
    """An id for a request, made at its arrival: the id its job takes, if it makes one."""
    return new_job_id(time.time())


@dataclass(slots=True)
class RequestObservation:
    """What is known about one API request while it runs."""

    started: float = field(default_factory=time.perf_counter)
    started_ns: int = 0
    # Made for the request at its arrival: its job takes it (a resumed stream's job has its own).
    own_id: str = field(default_factory=new_request_id)
    client_request_id: str | None = None
    # Set once the request names a configured model, and once it has a job.
    model: str = ""
    # The route the request named, if any (`router.routing`): its metrics' `route` label.
    route: str = ""
    # The GenAI operation it asked for (`switchboard.gen_ai.operation`), once known.
    operation: str = ""
    job_id: str = ""
    status: int = 0
    # Whether the request carried a job whose answer took time (end-to-end latency is recorded).
    generated: bool = False
    span: Any = None

    @property
    def request_id(self) -> str:
        """What `x-request-id` says, and log lines and spans: the job's id, else the request's own."""
        return self.job_id or self.own_id


_current: contextvars.ContextVar[RequestObservation | None] = contextvars.ContextVar(
    "switchboard_request", default=None
)


def current_request() -> RequestObservation | None:
    """The observation of the API request being handled, if any."""
    return _current.get()


def arrival_id() -> str | None:
    """The id made for the API request being handled at its arrival, which its job takes."""
    request = _current.get()
    return request.own_id if request is not None else None


def note_model(model: str) -> None:
    """The request is for `model` (a configured one): its metrics are labelled with it."""
    request = _current.get()
    if request is not None:
        request.model = model


def note_operation(operation: str) -> None:
    """The request asks for `operation` ("embeddings", ...): counted by it, even if refused."""
    request = _current.get()
    if request is not None:
        request.operation = operation


def note_client_left(scope: Scope) -> None:
    """The request's client left before its response's last byte."""
    scope[_CLIENT_LEFT] = True  # type: ignore[literal-required]


def client_left(scope: Scope) -> bool:
    """Whether the request's client left before its response's last byte (a 499, not our failure)."""
    return bool(scope.get(_CLIENT_LEFT))


def observe_requests(app: ASGIApp) -> ASGIApp:
    """Wrap `app`: every HTTP response's `x-request-id`; one server span per API request, and its
    count by model and status."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        request = RequestObservation(client_request_id=client_request_id(scope))
        if not scope["path"].startswith(OBSERVED_PREFIXES):
            await _identified(app, scope, receive, send, request)
            return
        token = _current.set(request)
        span: Any = _start_span(scope, request) if tracing.enabled() else None

        first_byte = span is not None

        async def observed_send(message: Message) -> None:
            nonlocal first_byte
            if message["type"] == "http.response.start":
                request.status = message["status"]
            elif first_byte and message.get("body"):
                first_byte = False
                request.span.add_event("first_byte")
            await send(message)

        try:
            if span is None:
                await _identified(app, scope, receive, observed_send, request)
            else:
                with tracing.current(span):
                    await _identified(app, scope, receive, observed_send, request)
        finally:
            _current.reset(token)
            if client_left(scope):
                request.status = CLIENT_CLOSED  # whatever the handler answered to nobody
            _finished(request, span)

    return middleware


async def _identified(
    app: ASGIApp, scope: Scope, receive: Receive, send: Send, request: RequestObservation
) -> None:
    """Run `app` with the request's ids on its log lines and spans, and `x-request-id` on its response."""

    async def send_with_id(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [*message.get("headers", ()), (REQUEST_ID_HEADER, request.request_id.encode())]
            message = {**message, "headers": headers}  # type: ignore[typeddict-item]
        await send(message)

    token = tracing.bind_request(request)
    try:
        await app(scope, receive, send_with_id)
    finally:
        tracing.unbind_request(token)


def unmatched_request_id() -> dict[str, str]:
    """The `x-request-id` header for a response that the middleware does not see (Litestar answers a
    request for no route, a 404 or a 405, before any middleware runs); none for one it sees."""
    if tracing.bound_request() is not None:
        return {}
    return {REQUEST_ID_HEADER.decode(): new_request_id()}


def client_request_id(scope: Scope) -> str | None:
    """The client's own `x-request-id`, if it sent a short, printable one."""
    for name, value in scope.get("headers", ()):
        if name == REQUEST_ID_HEADER:
            return value.decode("ascii") if _CLIENT_REQUEST_ID.fullmatch(value) else None
    return None


def _start_span(scope: Scope, request: RequestObservation) -> Any:
    from opentelemetry.trace import SpanKind

    method, path = str(scope.get("method", "GET")), scope["path"]
    route = MODELS_ROUTE if path.startswith(MODELS_ROUTE) else path
    headers = {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in scope.get("headers", ())
        if name in (b"traceparent", b"tracestate")
    }
    request.started_ns = tracing.now_ns()
    request.span = tracing.start_span(
        f"{method} {route}",
        parent=tracing.context_from(headers),
        kind=SpanKind.SERVER,
        start_ns=request.started_ns,
        attributes={
            "http.request.method": method,
            "url.path": path,
            "http.route": route,
            **({tracing.CLIENT_REQUEST_ID: request.client_request_id} if request.client_request_id else {}),
        },
    )
    return request.span


def _finished(request: RequestObservation, span: Any) -> None:
    # No response started: the client left first, or the server failed.
    status = request.status or CLIENT_CLOSED
    REQUESTS.labels(request.model, request.route, str(status)).inc()
    if request.operation:
        OPERATION_REQUESTS.labels(request.operation, request.model, str(status)).inc()
    if request.generated:
        E2E_LATENCY.labels(request.model, request.route).observe(time.perf_counter() - request.started)
    if span is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("http.response.status_code", status)
        span.set_attribute(tracing.REQUEST_ID, request.request_id)
        if request.model:
            span.set_attribute("gen_ai.request.model", request.model)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))
        span.end()
