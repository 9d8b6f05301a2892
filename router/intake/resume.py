"""Resuming a streamed answer: a client that lost its connection re-sends the request with
`Last-Event-ID` and gets the rest of the same answer, through this front door or another.

Every event of a streamed response has the id `<job id>:<result stream entry id>` (`router.relay.first_byte`).
The result stream of a job whose client left mid-stream is kept until it expires, and its cancel
mark waits `router.resume_grace_s` for such a client.
"""

from __future__ import annotations

import re

import msgspec

from router.intake.job import JOB_ID_PATTERN, created_of
from router.openai.errors import InvalidRequestError
from switchboard.wire import Job

_EVENT_ID = re.compile(rf"(?P<job_id>{JOB_ID_PATTERN}):(?P<ms>[0-9]{{1,20}})-(?P<seq>[0-9]{{1,20}})")
# Each half of a stream entry id is an unsigned 64-bit number: past it, Redis refuses the id.
_ENTRY_PART_MAX = 2**64 - 1


class ResumePoint(msgspec.Struct, frozen=True, kw_only=True):
    """Where a resumed stream goes on: after entry `entry_id` of job `job_id`'s results."""

    job_id: str
    entry_id: str

    def applied_to(self, job: Job) -> Job:
        """`job` (made from the re-sent request) as the job being resumed: its id and creation time."""
        return msgspec.structs.replace(job, id=self.job_id, created=created_of(self.job_id))


def resume_point(last_event_id: str | None, *, stream: bool) -> ResumePoint | None:
    """The point a streamed request's `Last-Event-ID` header names; None for a new answer."""
    if not stream or last_event_id is None or not last_event_id.strip():
        return None
    match = _EVENT_ID.fullmatch(last_event_id.strip())
    if match is None or max(int(match["ms"]), int(match["seq"])) > _ENTRY_PART_MAX:
        raise InvalidRequestError(
            f"Last-Event-ID {last_event_id[:100]!r} is not an event id of this server "
            "(`<job id>:<entry id>`, as sent in each event's `id:` line).",
            code="invalid_last_event_id",
        )
    return ResumePoint(job_id=match["job_id"], entry_id=f"{int(match['ms'])}-{int(match['seq'])}")
