"""Job ids: 48 bits of the millisecond they were made, then 80 random bits, as 32 hex digits.

Sorted by age, unique without coordination, and telling their own creation time, which a resumed
stream's job and a request's arrival id both rely on. Made by the front door (a request's id at its
arrival) and read back wherever an id arrives from a client (`Last-Event-ID`).
"""

from __future__ import annotations

import uuid

JOB_ID_PATTERN = r"[0-9a-f]{32}"


def new_job_id(created: float) -> str:
    """A unique id made at `created` (unix seconds), also used as the OpenAI response id's suffix."""
    return f"{int(created * 1000) & 0xFFFFFFFFFFFF:012x}{uuid.uuid4().hex[:20]}"


def created_of(job_id: str) -> float:
    """When the job with this id was made (unix seconds, to the millisecond)."""
    return int(job_id[:12], 16) / 1000
