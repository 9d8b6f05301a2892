"""A request that its model fails before the first byte is answered by a fallback.

A model that cannot load, that no live worker may hold, whose queue is full, whose context is too
short for the prompt, or whose engine fails the job, fails before anything of the answer went out:
the client has seen nothing, and another model can answer instead. For a route, that is its stable
version (its first target), so a bad canary costs its callers latency, not errors; for a pipeline of
fallbacks (`switchboard.config.pipelines`), its next step. Failures that another model would meet as
well (the key's own limits, Redis, the request's deadline, the client's mistakes) are answered as
they are, as is the last fallback's failure.

A streamed answer is retried only while its headers wait for the first chunk
(`router.first_byte_budget_s`); past that budget the headers and keep-alives are out, and an error
travels as an event, as for any model.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from prometheus_client import Counter

from router.openai.errors import (
    EngineError,
    InvalidRequestError,
    ModelLoadFailedError,
    NoWorkerForModelError,
    OpenAIError,
    TooManyRequestsError,
)
from router.telemetry.requests import current_request
from router.telemetry.rollout_observations import Observations
from switchboard.context_length import CONTEXT_LENGTH_EXCEEDED
from switchboard.metrics import REGISTRY

if TYPE_CHECKING:
    from router.routing.resolve import Resolution

logger = logging.getLogger(__name__)

# OpenAI's code for a prompt longer than the model's context (router.admission.fits).
CONTEXT_TOO_LONG = CONTEXT_LENGTH_EXCEEDED

FALLBACKS = Counter(
    "switchboard:fallbacks",
    "Requests that a model failed before the first byte, answered by a fallback instead: a route's "
    "stable version, or a pipeline's next step; by the route or pipeline the request named, the model "
    "that failed, and why (the error's code).",
    ["via", "model", "reason"],
    registry=REGISTRY,
)


def failed_on_the_model(error: OpenAIError) -> bool:
    """Whether `error` is the model's own failure, which another model may not meet."""
    if isinstance(error, TooManyRequestsError):
        return error.code == "queue_full"  # the key's limits would refuse the next model too
    if isinstance(error, InvalidRequestError):
        return error.code == CONTEXT_TOO_LONG  # another model may hold a longer context
    return isinstance(error, EngineError | ModelLoadFailedError | NoWorkerForModelError)


def note_failure(failed: Resolution, error: OpenAIError, observations: Observations) -> None:
    """A routed request refused before its job existed (no worker may hold its version, or its
    queue is full), counted as its version's failure while a rollout judges it: the job's own
    observer never saw it. Failures of a job that ran are counted by its observer."""
    refused = isinstance(error, NoWorkerForModelError) or (
        isinstance(error, TooManyRequestsError) and error.code == "queue_full"
    )
    if refused and failed.route is not None:
        observations.record_refused(failed.route.name, failed.served)


def note_fallback(failed: Resolution, fallback: str, error: OpenAIError) -> None:
    """Count and log a request that `failed.served` failed, sent to `fallback` instead."""
    via = failed.requested
    reason = error.code or type(error).__name__
    FALLBACKS.labels(via, failed.served, reason).inc()
    logger.info(
        "a model failed a request before its first byte; its fallback answers",
        extra={"via": via, "model": failed.served, "fallback": fallback, "reason": reason},
    )
    observed = current_request()
    if observed is not None and observed.span is not None:
        observed.span.add_event(
            "switchboard.fallback", {"switchboard.failed_model": failed.served, "error.type": reason}
        )
