"""What a request is charged once it ends: a queued job its usage, a resumed stream its share."""

from __future__ import annotations

from router.admission.charges import DeliveredShare, UsedTokens
from switchboard.wire import Chunk, ToolCall, Usage

LAST = Chunk(finish_reason="stop", usage=Usage(prompt_tokens=40, completion_tokens=100))


def test_a_queued_job_is_charged_its_prompt_and_completion() -> None:
    charge = UsedTokens()
    charge.chunk(Chunk(text="abc"))
    assert charge.tokens is None, "until the usage is known, the reservation stands"
    charge.chunk(LAST)
    assert charge.tokens == 140


def test_a_resumed_stream_is_charged_its_share_of_the_answer_by_characters() -> None:
    charge = DeliveredShare([Chunk(text="a" * 60)])
    charge.chunk(Chunk(text="b" * 39))
    assert charge.tokens is None
    charge.chunk(LAST)  # holds no text: counted as one character's worth
    # 40 of 100 characters were delivered again: 40 of the answer's 100 completion tokens; the
    # prompt, which was not processed again, is not charged.
    assert charge.tokens == 40


def test_a_resume_of_the_whole_answer_pays_all_of_it_and_tool_calls_count() -> None:
    charge = DeliveredShare([])
    charge.chunk(Chunk(tool_calls=(ToolCall(id="c", name="f", arguments="{}"),)))
    charge.chunk(LAST)
    assert charge.tokens == 100


def test_a_resume_that_ends_without_the_jobs_usage_keeps_its_reservation() -> None:
    charge = DeliveredShare([Chunk(text="a")])
    charge.chunk(Chunk(text="b" * 1000))
    assert charge.tokens is None
