"""Admission bounds (`[limits]`): requests in flight, jobs waiting per model, and the tokens a
request is counted at before its usage is known."""

from __future__ import annotations

from typing import Annotated

import msgspec

PositiveLimit = Annotated[int, msgspec.Meta(ge=1)]


class LimitsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Admission bounds: past them a request is refused at once (429 with Retry-After)."""

    # Requests admitted and not finished, across every front door sharing the Redis.
    max_in_flight: PositiveLimit = 2048
    # Jobs waiting on one model's stream that no worker has taken yet.
    max_queue_depth: PositiveLimit = 1024
    # Completion tokens counted against a key's tpm for a request without max_tokens, until the
    # job ends and its real usage replaces the estimate.
    estimated_completion_tokens: PositiveLimit = 256
