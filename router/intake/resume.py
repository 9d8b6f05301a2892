"""Resuming a streamed answer: a client that lost its connection re-sends the request with
`Last-Event-ID` and gets the rest of the same answer, through this front door or another.

A stream is in OpenAI's shape by default: `data:` events only, no `id:` lines, which line- and
read-based parsers (vLLM's `vllm bench serve` among them) cannot take. Two ways to resume it:

- **Event ids, for clients that ask.** A request with `X-Switchboard-Resumable: 1` (or one that
  carries an event id in `Last-Event-ID`, as EventSource does) gets an `id:` line on every event,
  `<job id>:<result stream entry id>` (`router.relay.first_byte`); it resumes with the last one seen.
- **Counting, for every client.** Every response carries its job's id in `x-request-id`; a client
  that received `n` events (`data:` lines before `[DONE]`) resumes with `Last-Event-ID:
  <x-request-id>:<n>`. The answer is relayed again from its start and its first `n` events skipped,
  so the stream goes on in the same shape, and counting goes on across resumes.

The result stream of a job whose client left mid-stream is kept until it expires, and its cancel
mark waits `router.resume_grace_s` for such a client.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import msgspec

from router.openai.errors import InvalidRequestError
from switchboard.job_ids import JOB_ID_PATTERN, created_of
from switchboard.wire import Job

# The request header asking for `id:` lines, and the values that mean yes.
RESUMABLE_HEADER = "x-switchboard-resumable"
_YES = frozenset({"1", "true", "yes", "on"})
LAST_EVENT_ID_HEADER = "last-event-id"
# The result stream's start: a counted resume reads the answer from there (`router.queue.results`).
FROM_THE_START = "0-0"

_EVENT_ID = re.compile(
    rf"(?P<job_id>{JOB_ID_PATTERN}):(?:(?P<ms>[0-9]{{1,20}})-(?P<seq>[0-9]{{1,20}})|(?P<count>[0-9]{{1,9}}))"
)
# Each half of a stream entry id is an unsigned 64-bit number: past it, Redis refuses the id.
_ENTRY_PART_MAX = 2**64 - 1


class ResumePoint(msgspec.Struct, frozen=True, kw_only=True):
    """Where a resumed stream goes on: after entry `entry_id` of job `job_id`'s results, less the
    first `events_had` events relayed from there (a client that counted what it received)."""

    job_id: str
    entry_id: str
    events_had: int = 0

    @property
    def counted(self) -> bool:
        """Whether the client named its place by counting events (it gets no `id:` lines)."""
        return self.entry_id == FROM_THE_START

    def applied_to(self, job: Job) -> Job:
        """`job` (made from the re-sent request) as the job being resumed: its id and creation time."""
        return msgspec.structs.replace(job, id=self.job_id, created=created_of(self.job_id))


def resume_point(last_event_id: str | None, *, stream: bool) -> ResumePoint | None:
    """The point a streamed request's `Last-Event-ID` header names; None for a new answer."""
    if not stream or last_event_id is None or not last_event_id.strip():
        return None
    match = _EVENT_ID.fullmatch(last_event_id.strip())
    if match is None or (
        match["count"] is None and max(int(match["ms"]), int(match["seq"])) > _ENTRY_PART_MAX
    ):
        raise InvalidRequestError(
            f"Last-Event-ID {last_event_id[:100]!r} is not an event id of this server: "
            "`<x-request-id>:<events received>`, or `<job id>:<entry id>` as sent in `id:` lines "
            f"to clients that ask for them ({RESUMABLE_HEADER}: 1).",
            code="invalid_last_event_id",
        )
    if match["count"] is not None:
        return ResumePoint(job_id=match["job_id"], entry_id=FROM_THE_START, events_had=int(match["count"]))
    return ResumePoint(job_id=match["job_id"], entry_id=f"{int(match['ms'])}-{int(match['seq'])}")


def wants_event_ids(headers: Mapping[str, str], resume: ResumePoint | None) -> bool:
    """Whether a streamed response carries `id:` lines (and progress comments): its client asked with
    `X-Switchboard-Resumable`, or resumes from an event id, which only `id:` lines told it."""
    if resume is not None and not resume.counted:
        return True
    return headers.get(RESUMABLE_HEADER, "").strip().lower() in _YES
