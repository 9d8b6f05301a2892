"""A routed request that its version fails before the first byte is answered by the route's stable one.

A canary that cannot load, that no live worker may hold, whose queue is full, or whose engine fails
the job, fails before anything of the answer went out: the client has seen nothing, and the stable
version (the route's first target) can answer instead. A bad canary then costs its callers latency,
not errors. Failures that another version would meet as well (the key's own limits, Redis, the
request's deadline, the client's mistakes) are answered as they are.

A streamed answer is retried only while its headers wait for the first chunk
(`router.first_byte_budget_s`); past that budget the headers and keep-alives are out, and an error
travels as an event, as for any model.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter

from router.openai.errors import (
    EngineError,
    ModelLoadFailedError,
    NoWorkerForModelError,
    OpenAIError,
    TooManyRequestsError,
)
from switchboard.metrics import REGISTRY

logger = logging.getLogger(__name__)

ROUTE_RETRIES = Counter(
    "switchboard:route_retries",
    "Routed requests that their version failed before the first byte, answered by the route's stable "
    "version instead, by route, the version that failed, and why (the error's code).",
    ["route", "model", "reason"],
    registry=REGISTRY,
)


def failed_on_the_model(error: OpenAIError) -> bool:
    """Whether `error` is the model's own failure, which another version of it may not meet."""
    if isinstance(error, TooManyRequestsError):
        return error.code == "queue_full"  # the key's limits would refuse the stable version too
    return isinstance(error, EngineError | ModelLoadFailedError | NoWorkerForModelError)


def note_retry(route: str, model: str, stable: str, error: OpenAIError) -> None:
    """Count and log a request of `route` that `model` failed, sent to `stable` instead."""
    reason = error.code or type(error).__name__
    ROUTE_RETRIES.labels(route, model, reason).inc()
    logger.info(
        "a routed request failed on its version before the first byte; retried on the stable one",
        extra={"route": route, "model": model, "stable": stable, "reason": reason},
    )
