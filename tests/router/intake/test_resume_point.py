"""`Last-Event-ID` read into a resume point, in both of its forms, and who gets `id:` lines."""

from __future__ import annotations

import pytest

from router.intake.resume import FROM_THE_START, ResumePoint, resume_point, wants_event_ids
from router.openai.errors import InvalidRequestError

JOB = "0123456789abcdef0123456789abcdef"


def test_an_event_id_names_an_entry_of_the_jobs_results() -> None:
    point = resume_point(f"{JOB}:1700000000000-3", stream=True)
    assert point == ResumePoint(job_id=JOB, entry_id="1700000000000-3")
    assert not point.counted


def test_a_count_names_the_events_the_client_had_from_the_start() -> None:
    point = resume_point(f" {JOB}:12 ", stream=True)
    assert point == ResumePoint(job_id=JOB, entry_id=FROM_THE_START, events_had=12)
    assert point.counted
    assert resume_point(f"{JOB}:0", stream=True) == ResumePoint(job_id=JOB, entry_id=FROM_THE_START)


@pytest.mark.parametrize(
    "value",
    ["7", f"{JOB}", f"{JOB}:", f"{JOB}:-1", f"{JOB}:1-", f"{JOB}:1234567890", "nope:3", f"{JOB}:{2**64}-0"],
)
def test_anything_else_is_a_400(value: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        resume_point(value, stream=True)
    assert refused.value.code == "invalid_last_event_id"
    assert "x-switchboard-resumable" in str(refused.value.body()).lower()


def test_without_a_stream_or_a_value_there_is_nothing_to_resume() -> None:
    assert resume_point(f"{JOB}:3", stream=False) is None
    assert resume_point("  ", stream=True) is None
    assert resume_point(None, stream=True) is None


@pytest.mark.parametrize(
    ("headers", "last_event_id", "ids"),
    [
        ({}, None, False),
        ({"x-switchboard-resumable": "1"}, None, True),
        ({"x-switchboard-resumable": " TRUE "}, None, True),
        ({"x-switchboard-resumable": "0"}, None, False),
        ({}, f"{JOB}:5-0", True),  # EventSource: it had `id:` lines, it goes on with them
        ({}, f"{JOB}:5", False),  # it counted: it goes on counting
        ({"x-switchboard-resumable": "yes"}, f"{JOB}:5", True),
    ],
)
def test_id_lines_go_to_clients_that_ask(
    headers: dict[str, str], last_event_id: str | None, ids: bool
) -> None:
    point = resume_point(last_event_id, stream=True)
    assert wants_event_ids(headers, point) is ids
