"""OpenAI's error object, and the typed errors that handlers raise to produce it.

Handlers never build error JSON themselves: they raise one of these, and `router.app` maps every
exception (ours, Litestar's and msgspec's) to ``{"error": {"message", "type", "param", "code"}}``
with the matching status code, in one place.
"""

from __future__ import annotations

import math
import re

import msgspec


class ErrorDetail(msgspec.Struct, kw_only=True):
    """The body of OpenAI's error object."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(msgspec.Struct, kw_only=True):
    """OpenAI's error response: ``{"error": {...}}``."""

    error: ErrorDetail


class OpenAIError(Exception):
    """Base of every error that leaves the front door in OpenAI's shape."""

    status_code = 500
    error_type = "internal_error"
    default_code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.default_code
        # Sent with the error's response (Retry-After, for errors that pass); lost once a stream's
        # headers are gone.
        self.headers: dict[str, str] = headers or {}

    def body(self) -> ErrorBody:
        """The error object sent to the client."""
        detail = ErrorDetail(message=self.message, type=self.error_type, param=self.param, code=self.code)
        return ErrorBody(error=detail)


class InvalidRequestError(OpenAIError):
    """The request is malformed or asks for something impossible (400)."""

    status_code = 400
    error_type = "invalid_request_error"


# The most model names a 404 for an unknown model lists.
MODELS_NAMED_IN_404 = 20


class ModelNotFoundError(OpenAIError):
    """The requested model is not served here (404)."""

    status_code = 404
    error_type = "invalid_request_error"
    default_code = "model_not_found"

    def __init__(self, model: str, visible: list[str]) -> None:
        # `visible`: the models the caller may use, never the others (nor any, to an unknown caller).
        # A catalogue of many fine-tunes would make the error as long as the catalogue: the first
        # few are named, and `GET /v1/models` lists them all.
        shown = visible[:MODELS_NAMED_IN_404]
        more = len(visible) - len(shown)
        rest = f" and {more} more (GET /v1/models lists them all)" if more else ""
        listed = f" Models you may use here: {', '.join(shown)}{rest}." if visible else ""
        super().__init__(f"The model `{model}` does not exist.{listed}", param="model")


class ModelTakesNoImagesError(InvalidRequestError):
    """An image sent to a model that takes text only (400), before anything is queued."""

    def __init__(self, model: str) -> None:
        super().__init__(
            f"The model `{model}` takes no images; send text only, or name a model that takes images "
            "(`GET /v1/models` lists them with `input_modalities`).",
            param="messages",
            code="model_takes_no_images",
        )


class NoSuchFileError(OpenAIError):
    """A file that does not exist, or that another key uploaded (404 either way: the caller learns
    nothing of other keys' files)."""

    status_code = 404
    error_type = "invalid_request_error"
    default_code = "file_not_found"

    def __init__(self, file_id: str) -> None:
        super().__init__(f"No such File object: {file_id}", param="file_id")


class RouteNotFoundError(OpenAIError):
    """No endpoint at that path (404)."""

    status_code = 404
    error_type = "invalid_request_error"
    default_code = "not_found"


class MethodNotAllowedError(OpenAIError):
    """The endpoint exists but not for that HTTP method (405)."""

    status_code = 405
    error_type = "invalid_request_error"
    default_code = "method_not_allowed"


class ServiceUnavailableError(OpenAIError):
    """The queue or the workers cannot take the request now (503)."""

    status_code = 503
    error_type = "service_unavailable"
    default_code = "service_unavailable"


def retry_after_header(seconds: float) -> dict[str, str]:
    """`Retry-After` in whole seconds, at least 1 (a client told 0 would retry at once)."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


class RetryLaterError(ServiceUnavailableError):
    """A 503 that says when to come back: `Retry-After` in whole seconds, and the same number at the
    end of its message (`then`, with `{}` where the seconds go)."""

    def __init__(self, message: str, retry_after_s: float, *, then: str = "Retry in {} s.") -> None:
        headers = retry_after_header(retry_after_s)
        super().__init__(f"{message} {then.format(headers['Retry-After'])}", headers=headers)


class ModelLoadFailedError(RetryLaterError):
    """The model's last load failed and is not retried yet (503 with Retry-After)."""

    default_code = "model_load_failed"

    def __init__(self, model: str, reason: str, retry_after_s: float) -> None:
        reason = reason.strip().rstrip(".") or "no reason given"
        super().__init__(
            f"Model `{model}` failed to load: {reason}.", retry_after_s, then="Retrying in {} s."
        )


class ModelLoadingError(RetryLaterError):
    """The request's deadline passed while its model was still loading, or not loaded at all (503)."""

    default_code = "model_loading"

    def __init__(
        self, model: str, *, loading: bool, typical_load_s: float | None, retry_after_s: float
    ) -> None:
        state = "is still loading" if loading else "is not loaded yet and no worker has started loading it"
        usually = (
            f"a load usually takes about {typical_load_s:.0f} s"
            if typical_load_s is not None
            else "how long a load takes is not known yet"
        )
        super().__init__(
            f"Model `{model}` {state} ({usually}); the request was dropped when its deadline passed.",
            retry_after_s,
        )


class JobTimeoutError(OpenAIError):
    """The job did not finish before its deadline (504)."""

    status_code = 504
    error_type = "timeout"
    default_code = "timeout"


class EngineError(OpenAIError):
    """The engine failed while generating (500)."""

    status_code = 500
    error_type = "internal_error"
    default_code = "engine_error"


_LOCATION = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_MISSING = re.compile(r"missing required field `(?P<field>[^`]+)`")


def from_validation_error(exc: msgspec.ValidationError | msgspec.DecodeError) -> InvalidRequestError:
    """Turn msgspec's decode/validation error into a 400 naming the offending field in `param`."""
    text = str(exc)
    if not isinstance(exc, msgspec.ValidationError):
        return InvalidRequestError(f"The request body is not valid JSON: {text}")
    match = _LOCATION.search(text)
    # A dictionary's value shows as `[...]` in msgspec's path: the dictionary is the parameter.
    path = match.group("path").lstrip(".").replace("[...]", "") if match else ""
    message = text[: match.start()] if match else text
    missing = _MISSING.search(message)
    if missing:
        path = f"{path}.{missing.group('field')}" if path else missing.group("field")
        return InvalidRequestError(
            f"Missing required parameter: `{path}`.", param=path, code="missing_required_parameter"
        )
    if not path:
        return InvalidRequestError(f"Invalid request body: {message}")
    return InvalidRequestError(f"Invalid value for `{path}`: {message}", param=path, code="invalid_value")


class UnsupportedMediaTypeError(InvalidRequestError):
    """The body is not sent as JSON (415)."""

    status_code = 415
    default_code = "unsupported_media_type"


class PayloadTooLargeError(InvalidRequestError):
    """The body is larger than its endpoint takes (413)."""

    status_code = 413
    default_code = "request_too_large"


class AuthenticationError(OpenAIError):
    """No API key, or one that is not known here (401)."""

    status_code = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"


class ModelNotAllowedError(OpenAIError):
    """The caller's key may not use that model (403)."""

    status_code = 403
    error_type = "invalid_request_error"
    default_code = "model_not_allowed"

    def __init__(self, model: str, key_name: str) -> None:
        super().__init__(f"The API key `{key_name}` may not use the model `{model}`.", param="model")


class TierNotAllowedError(OpenAIError):
    """The caller's key may not ask for that service tier (403)."""

    status_code = 403
    error_type = "invalid_request_error"
    default_code = "service_tier_not_allowed"

    def __init__(self, tier: str, key_name: str, allowed: list[str]) -> None:
        super().__init__(
            f"The API key `{key_name}` may not use the `{tier}` service tier; it may use "
            f"{', '.join(allowed)} (an operator grants tiers with `service_tiers`).",
            param="service_tier",
        )


class AdminKeyRequiredError(OpenAIError):
    """An admin endpoint called with a key that is not an admin key (403)."""

    status_code = 403
    error_type = "invalid_request_error"
    default_code = "admin_key_required"


class TooManyRequestsError(OpenAIError):
    """Refused at admission: a key's limit, the model's queue or the front doors are full (429).

    `code` says which: rate_limit_exceeded (the key's rpm, tpm or parallel requests), quota_exceeded
    (a key's or its team's tokens per day or month), queue_full (the model's queue), server_busy
    (requests in flight across the front doors).
    """

    status_code = 429
    error_type = "requests"
    default_code = "rate_limit_exceeded"

    def __init__(
        self, message: str, *, retry_after_s: float, code: str | None = None, tokens: bool = False
    ) -> None:
        headers = retry_after_header(retry_after_s)
        super().__init__(f"{message} Retry in {headers['Retry-After']} s.", code=code, headers=headers)
        if tokens:
            self.error_type = "tokens"


class RedisFullError(RetryLaterError):
    """Redis refused a write because it is out of memory (503 with Retry-After): nothing was queued.

    Its code is `redis_full`; `queue_full` is the 429 of a model's queue at `limits.max_queue_depth`.
    """

    default_code = "redis_full"

    def __init__(self, retry_after_s: float) -> None:
        super().__init__("The job queue is full (Redis is out of memory); nothing was queued.", retry_after_s)


class RedisUnavailableError(RetryLaterError):
    """Redis cannot be reached: nothing was queued (503 with Retry-After). Where it is and what it
    said stay in the front door's log."""

    default_code = "redis_unavailable"

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(
            "Redis is unavailable (the job queue cannot be reached).",
            retry_after_s,
            then="Nothing was queued; retry in {} s.",
        )


class ResultsLostError(RetryLaterError):
    """Redis restarted and lost the job (or its results) while the client waited (503)."""

    default_code = "redis_restarted"

    def __init__(self, job_id: str, retry_after_s: float) -> None:
        super().__init__(
            f"The job queue (Redis) restarted and lost job {job_id} and its results;",
            retry_after_s,
            then="send the request again (in {} s).",
        )


class NoWorkerForModelError(RetryLaterError):
    """No live worker may hold the model: a queued job would wait for nobody (503 with Retry-After)."""

    default_code = "no_worker_for_model"

    def __init__(self, model: str, retry_after_s: float) -> None:
        super().__init__(
            f"No live worker serves the model `{model}` (every live worker is limited to other models).",
            retry_after_s,
            then="Start a worker that may hold it, or retry in {} s.",
        )


class NoWorkerAliveError(RetryLaterError):
    """The request's deadline passed while no live worker could take its job: none was alive, or
    none that may hold its model (503 with Retry-After)."""

    default_code = "no_worker_alive"

    def __init__(self, model: str, waited_s: float, retry_after_s: float) -> None:
        super().__init__(
            f"No worker that may hold the model `{model}` was alive to take the job during the "
            f"{waited_s:g} s it waited in the queue.",
            retry_after_s,
            then="Start a worker, or retry in {} s.",
        )


class StreamNotFoundError(OpenAIError):
    """A `Last-Event-ID` names a job whose results are unknown here or have expired (404)."""

    status_code = 404
    error_type = "invalid_request_error"
    default_code = "stream_not_found"


class RequestTimeoutError(OpenAIError):
    """The request's headers did not arrive in time (408); the connection is closed."""

    status_code = 408
    error_type = "invalid_request_error"
    default_code = "request_timeout"


class HeadersTooLargeError(OpenAIError):
    """The request's headers are larger than the front door reads (431); the connection is closed."""

    status_code = 431
    error_type = "invalid_request_error"
    default_code = "request_header_fields_too_large"


class TooManyConnectionsError(RetryLaterError):
    """The front door holds as many connections as it may (503 with Retry-After); this one is closed."""

    default_code = "too_many_connections"

    def __init__(self, retry_after_s: float) -> None:
        super().__init__("The server has too many open connections.", retry_after_s)


class ClientClosedRequestError(OpenAIError):
    """The client left before its answer (nginx's 499): counted as the client's doing, never sent."""

    status_code = 499
    error_type = "invalid_request_error"
    default_code = "client_closed_request"


class HostNotAllowedError(OpenAIError):
    """A front door without API keys was called by a name that is not its own (403): DNS rebinding."""

    status_code = 403
    error_type = "invalid_request_error"
    default_code = "host_not_allowed"


class OriginNotAllowedError(OpenAIError):
    """A front door without API keys was called from another site's web page (403)."""

    status_code = 403
    error_type = "invalid_request_error"
    default_code = "origin_not_allowed"


class KeyBodyBytesError(TooManyRequestsError):
    """The bodies a key is sending at once would hold more bytes than a key may (429 with
    Retry-After); the body is not read and its connection is closed."""

    default_code = "too_many_body_bytes"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message, retry_after_s=retry_after_s, code=self.default_code)


class ServerBodyBytesError(RetryLaterError):
    """The bodies being sent to the front door at once would hold more bytes than it takes (503 with
    Retry-After); the body is not read and its connection is closed."""

    default_code = "too_many_body_bytes"
