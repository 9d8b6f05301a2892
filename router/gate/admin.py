"""The gates of the admin API's writes: a model's load or unload, a route's weights, a rollout's plan,
a pipeline's definition, an adapter's registration.

Their bodies are small by nature (a plan, a few weights, one pipeline's steps), so each is bounded
far below the generation endpoints' `max_body_bytes`; what they hold is checked by their structs
(unknown fields refused) and, where it needs the live state, by the handler's own validation
(`switchboard.rollout.checked_plan`, `switchboard.config.pipeline_checks`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from router.gate.gate import Gate, unchecked
from switchboard.config import ModelConfig, PipelineConfig
from switchboard.rollout import RolloutPlan

# The largest admin body taken: a pipeline of hundreds of steps is a few kilobytes.
ADMIN_MAX_BODY_BYTES = 256 * 1024


class WeightsRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `PUT /admin/routes/{name}/weights`: every target → a whole percent, summing to 100
    (checked against the route by `switchboard.routes.checked_weights`)."""

    weights: dict[str, Any]


class ModelStateRequest(msgspec.Struct, kw_only=True):
    """Body of `POST /admin/models/{name}/load` or `/unload`: nothing (the path says it all)."""


MODEL_STATE = Gate(
    "model state request",
    msgspec.json.Decoder(ModelStateRequest),
    unchecked,
    max_bytes=ADMIN_MAX_BODY_BYTES,
    empty_as=b"{}",
)
ROUTE_WEIGHTS = Gate(
    "route weights", msgspec.json.Decoder(WeightsRequest), unchecked, max_bytes=ADMIN_MAX_BODY_BYTES
)
ROLLOUT_PLAN = Gate(
    "rollout plan", msgspec.json.Decoder(RolloutPlan), unchecked, max_bytes=ADMIN_MAX_BODY_BYTES
)
PIPELINE_DEFINITION = Gate(
    "pipeline definition", msgspec.json.Decoder(PipelineConfig), unchecked, max_bytes=ADMIN_MAX_BODY_BYTES
)
# Its fields are a `[[models]]` entry's (unknown fields refused); what an adapter may set of them is
# checked by the registry (`switchboard.adapter_registry`).
ADAPTER_DEFINITION = Gate(
    "adapter definition", msgspec.json.Decoder(ModelConfig), unchecked, max_bytes=ADMIN_MAX_BODY_BYTES
)
