"""Why the front door is not ready: the error codes `/readyz` answers with, and what they mean.

Shared so that tools waiting on readiness (`switchboard up`, probes) need not parse messages.
"""

from __future__ import annotations

REDIS_UNREACHABLE = "redis_unreachable"
NO_LIVE_WORKER = "no_live_worker"
NO_WORKER_FOR_MODEL = "no_worker_for_model"
# Workers are alive, but none has Triton running and its engines' runtime imported yet: a first
# request would wait for that (tens of seconds) on top of its model's load.
ENGINES_PREPARING = "engines_preparing"

# What a person waiting for the stack to start is told, by code.
WAITING_FOR = {
    NO_LIVE_WORKER: "the worker is starting",
    REDIS_UNREACHABLE: "the front door cannot reach Redis yet",
    NO_WORKER_FOR_MODEL: "no live worker may hold the model",
    ENGINES_PREPARING: "the worker is preparing its engines: starting Triton, importing the engine runtime",
}
