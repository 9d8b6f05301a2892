"""A cascade's draft judged: kept when it finished normally, fits the requested JSON structure and is
confident enough; its chunks as the client gets them, with usage that adds up."""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import AsyncIterator, Iterable
from types import FrameType
from typing import Any

import msgspec
import pytest

from router.intake.job import chat_job
from router.intake.tools import plan_tools
from router.openai.chat import ChatCompletionRequest
from router.relay.chat import ChatRelay
from router.routing.pipelines.cascade import (
    ACCEPTED,
    DraftVerdict,
    client_chunks,
    draft_failed,
    draft_sampling,
    draft_too_slow,
    judge_draft,
)
from router.routing.pipelines.spent_tokens import usage_added
from switchboard.wire import (
    Chunk,
    JobError,
    SamplingParams,
    StructuredOutput,
    TokenLogprob,
    TopLogprob,
    Usage,
)

USAGE = Usage(prompt_tokens=9, completion_tokens=4)
DRAFT_USAGE = Usage(prompt_tokens=9, completion_tokens=6)


def tokens(*logprobs: float | None) -> tuple[TokenLogprob, ...]:
    return tuple(TokenLogprob(token=f"t{i}", logprob=value) for i, value in enumerate(logprobs))


def answer(
    text: str = "Paris.", *, finish: str = "stop", logprobs: Iterable[float | None] = (-0.2, -0.4)
) -> list[Chunk]:
    """One choice in two chunks, as a worker writes it."""
    half = len(text) // 2
    values = tuple(logprobs)
    return [
        Chunk(text=text[:half], logprobs=tokens(*values[:1])),
        Chunk(text=text[half:], logprobs=tokens(*values[1:]), finish_reason=finish, usage=USAGE),  # type: ignore[arg-type]
    ]


def judged(
    chunks: list[Chunk],
    *,
    structure: StructuredOutput | None = None,
    min_mean_logprob: float = -1.0,
    length_is_normal: bool = False,
) -> DraftVerdict:
    return judge_draft(
        chunks, min_mean_logprob=min_mean_logprob, structure=structure, length_is_normal=length_is_normal
    )


def rejected_for(chunks: list[Chunk], **options: Any) -> str:
    verdict = judged(chunks, **options)
    assert not verdict.accepted
    return verdict.reason


# --- finished normally ----------------------------------------------------------------------------


def test_a_confident_draft_that_stopped_is_kept_with_its_mean_log_probability() -> None:
    verdict = judged(answer(logprobs=(-0.2, -0.4)))
    assert (verdict.accepted, verdict.reason) == (True, ACCEPTED)
    assert verdict.mean_logprob == pytest.approx(-0.3)


def test_a_draft_cut_at_its_length_is_kept_only_when_the_client_set_that_length() -> None:
    cut = answer(finish="length")
    assert rejected_for(cut) == "finished by length"
    assert judged(cut, length_is_normal=True).accepted


def test_an_aborted_draft_is_not_kept() -> None:
    assert rejected_for(answer(finish="abort")) == "finished by abort"


def test_each_choice_must_finish_and_the_reason_names_the_one_that_did_not() -> None:
    chunks = [
        Chunk(text="a", index=0, logprobs=tokens(-0.1), finish_reason="stop"),
        Chunk(text="b", index=1, logprobs=tokens(-0.1), finish_reason="length"),
        Chunk(text="c", index=2, logprobs=tokens(-0.1), finish_reason="stop", usage=USAGE),
    ]
    assert rejected_for(chunks) == "choice 1 finished by length"
    unfinished = [Chunk(text="a", index=0, logprobs=tokens(-0.1)), *chunks[1:]]
    assert rejected_for(unfinished, length_is_normal=True) == "choice 0 did not finish"


def test_a_draft_that_failed_is_not_kept_and_says_why() -> None:
    failed = [Chunk(text="Par"), Chunk(error=JobError(code="engine_error", message="CUDA out of memory"))]
    verdict = judged(failed)
    assert verdict.reason == "the draft failed: CUDA out of memory"
    assert not verdict.accepted
    assert rejected_for(answer()[:1]) == "the draft failed: its answer ended before its last chunk"
    assert rejected_for([]) == "the draft failed: its answer ended before its last chunk"
    long_failure = [Chunk(error=JobError(code="engine_error", message="trace " * 1000))]
    assert len(rejected_for(long_failure)) <= 300


def test_verdicts_for_a_run_that_failed_or_was_too_slow() -> None:
    assert draft_too_slow(10.0) == DraftVerdict(
        accepted=False, reason="the draft took longer than 10 s", mean_logprob=None
    )
    assert draft_too_slow(2.5).reason == "the draft took longer than 2.5 s"
    assert draft_failed("The job did not finish within 30 s.").reason == (
        "the draft failed: The job did not finish within 30 s."
    )


# --- structure ------------------------------------------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def schema(value: Any) -> StructuredOutput:
    return StructuredOutput(json_schema=json.dumps(value))


def test_a_json_object_draft_must_be_a_json_object() -> None:
    wanted = StructuredOutput(json_object=True)
    assert judged(answer('{"a": [1, 2]}'), structure=wanted).accepted
    assert rejected_for(answer('{"a": [1, 2'), structure=wanted).startswith("not valid JSON: ")
    assert rejected_for(answer("[1, 2]"), structure=wanted) == "not a JSON object"
    # Python reads NaN; JSON has no such value.
    assert rejected_for(answer('{"a": NaN}'), structure=wanted) == "not valid JSON: NaN is not JSON"


def test_a_draft_must_match_the_schema_of_the_clients_response_format() -> None:
    request = msgspec.convert(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Who?"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
        },
        ChatCompletionRequest,
    )
    structure = chat_job(request, timeout_s=30).sampling.structured  # the job's own constraint
    assert judged(answer('{"name": "Ada", "age": 36}'), structure=structure).accepted
    assert rejected_for(answer('{"name": "Ada", "age": "36"}'), structure=structure) == (
        "does not match the schema: $.age: '36' is not of type 'integer'"
    )
    assert rejected_for(answer('{"name": "Ada"}'), structure=structure) == (
        "does not match the schema: $: 'age' is a required property"
    )


def test_a_required_tool_call_draft_must_be_a_list_of_calls_to_the_offered_tools() -> None:
    request = msgspec.convert(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [{"type": "function", "function": {"name": "weather", "parameters": PERSON}}],
            "tool_choice": "required",
        },
        ChatCompletionRequest,
    )
    _, structure = plan_tools(request, "m", None)
    call = [{"name": "weather", "parameters": {"name": "Paris", "age": 2000}}]
    assert judged(answer(json.dumps(call)), structure=structure).accepted
    other = [{"name": "stocks", "parameters": {"name": "Paris", "age": 2000}}]
    assert rejected_for(answer(json.dumps(other)), structure=structure) == (
        "does not match the schema: $[0].name: 'stocks' is not one of ['weather']"
    )


def test_the_schema_is_read_by_the_draft_its_schema_keyword_names() -> None:
    # Draft 4's exclusiveMaximum is a flag on `maximum`; from draft 6 on it is a number, so this
    # schema is valid only as draft 4, and there 5 is out of range.
    draft4 = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "integer",
        "maximum": 5,
        "exclusiveMaximum": True,
    }
    assert judged(answer("4"), structure=schema(draft4)).accepted
    assert rejected_for(answer("5"), structure=schema(draft4)).startswith("does not match the schema: $: 5 ")
    newest = {k: v for k, v in draft4.items() if k != "$schema"}
    assert rejected_for(answer("4"), structure=schema(newest)).startswith(
        "the requested schema is not a valid JSON Schema: True is not of type 'number'"
    )


@pytest.mark.parametrize(
    ("bad_schema", "reason"),
    [
        ({"type": "nope"}, "the requested schema is not a valid JSON Schema: "),
        ({"$ref": "https://example.com/person.json"}, "the requested schema cannot be applied: "),
        ({"$ref": "#/$defs/missing"}, "the requested schema cannot be applied: "),
        ({"$ref": "#"}, "the requested schema cannot be applied: its references loop"),
    ],
)
def test_a_schema_that_cannot_be_applied_rejects_the_draft_with_the_reason(
    bad_schema: dict[str, Any], reason: str
) -> None:
    # Nothing is fetched: a remote `$ref` is unresolvable, at once.
    assert rejected_for(answer("{}"), structure=schema(bad_schema)).startswith(reason)


def test_a_looping_schema_runs_no_garbage_collection_at_the_recursion_limit() -> None:
    """A schema whose `$ref` loops recurses to Python's limit before it is refused; a garbage
    collection down there would run collected objects' finalizers with no stack left, and each
    would fail (a full test run once failed on 18 of them). With a collection due at every
    allocation, none runs deep in the check."""
    depths: list[int] = []

    def note_depth(phase: str, _: dict[str, int]) -> None:
        if phase == "start":
            frame: FrameType | None = sys._getframe()
            depth = 0
            while frame is not None:
                depth, frame = depth + 1, frame.f_back
            depths.append(depth)

    thresholds = gc.get_threshold()
    gc.callbacks.append(note_depth)
    gc.set_threshold(1, 1, 1)
    try:
        reason = rejected_for(answer("{}"), structure=schema({"$ref": "#"}))
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(note_depth)
    assert reason == "the requested schema cannot be applied: its references loop"
    assert depths, "collections were due at every allocation"
    assert max(depths) < sys.getrecursionlimit() // 2


def test_a_reason_quoting_a_long_draft_is_cut() -> None:
    long_name = json.dumps({"name": "x" * 5000, "age": "old"})
    reason = rejected_for(answer(long_name), structure=schema(PERSON))
    assert reason.startswith("does not match the schema: $.")
    assert len(reason) <= 300


def test_each_choice_must_fit_the_structure() -> None:
    chunks = [
        Chunk(text="{}", index=0, logprobs=tokens(-0.1), finish_reason="stop"),
        Chunk(text="{", index=1, logprobs=tokens(-0.1), finish_reason="stop", usage=USAGE),
    ]
    assert rejected_for(chunks, structure=StructuredOutput(json_object=True)).startswith(
        "choice 1 not valid JSON: "
    )


def test_constraints_the_engine_holds_by_its_grammar_are_not_checked_again() -> None:
    for structure in (
        StructuredOutput(regex="[0-9]+"),
        StructuredOutput(choice=("yes", "no")),
        StructuredOutput(grammar='root ::= "a"'),
    ):
        assert judged(answer("anything"), structure=structure).accepted


# --- confidence -----------------------------------------------------------------------------------


def test_a_draft_below_the_threshold_is_not_kept_and_says_by_how_much() -> None:
    verdict = judged(answer(logprobs=(-1.5, -2.16)))
    assert verdict.reason == "mean token log-probability -1.83 below -1.00"
    assert verdict.mean_logprob == pytest.approx(-1.83)
    assert judged(answer(logprobs=(-1.0, -1.0))).accepted  # at the threshold is enough


def test_the_mean_counts_every_token_of_every_choice_and_skips_tokens_without_one() -> None:
    chunks = [
        Chunk(text="a", index=0, logprobs=tokens(None, -0.5, -0.5), finish_reason="stop"),
        Chunk(text="b", index=1, logprobs=tokens(-2.0), finish_reason="stop", usage=USAGE),
    ]
    verdict = judged(chunks)
    assert verdict.mean_logprob == pytest.approx(-1.0)
    assert verdict.accepted
    assert judged(chunks, min_mean_logprob=-0.9).reason == "mean token log-probability -1.00 below -0.90"


def test_a_draft_without_log_probabilities_is_not_kept() -> None:
    assert rejected_for(answer(logprobs=())) == "the draft carried no log-probabilities"
    assert rejected_for(answer(logprobs=(None,))) == "the draft carried no log-probabilities"


def test_the_checks_run_in_order_and_the_first_failed_one_is_the_reason() -> None:
    cut_and_unsure = answer('{"a"', finish="length", logprobs=(-5.0, -5.0))
    assert rejected_for(cut_and_unsure, structure=StructuredOutput(json_object=True)) == "finished by length"
    assert rejected_for(
        cut_and_unsure, structure=StructuredOutput(json_object=True), length_is_normal=True
    ).startswith("not valid JSON: ")
    # A rejected draft still tells its mean, for the trace and the metrics.
    assert judged(cut_and_unsure).mean_logprob == pytest.approx(-5.0)


# --- what the client gets -------------------------------------------------------------------------


def test_the_draft_is_always_asked_for_its_own_tokens_log_probabilities() -> None:
    plain = SamplingParams(max_tokens=7, temperature=0.3)
    assert draft_sampling(plain) == SamplingParams(max_tokens=7, temperature=0.3, logprobs=0)
    asked = SamplingParams(max_tokens=7, logprobs=3)
    assert draft_sampling(asked) == asked


async def feed(chunks: Iterable[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


async def events(relay: ChatRelay, chunks: Iterable[Chunk]) -> list[bytes]:
    return [event async for event in relay.events(feed(chunks))]


def relay() -> ChatRelay:
    return ChatRelay(job_id="j1", model="m", created=1700000000, include_usage=True)


async def test_a_kept_draft_reaches_a_client_that_asked_no_log_probabilities_as_an_answer_without_them() -> (
    None
):
    draft = [
        Chunk(text="Par", logprobs=tokens(-0.1)),
        Chunk(text="", logprobs=tokens(-0.2)),  # a token that added no text yet (half a character)
        Chunk(text="is", logprobs=tokens(-0.3), finish_reason="stop", usage=DRAFT_USAGE),
    ]
    plain = [
        Chunk(text="Par"),
        Chunk(text="is", finish_reason="stop", usage=DRAFT_USAGE),
    ]
    kept = client_chunks(draft, wanted_logprobs=False, extra_usage=None)
    assert all(not chunk.logprobs for chunk in kept)
    assert await events(relay(), kept) == await events(relay(), plain)


async def test_a_kept_draft_keeps_the_log_probabilities_its_client_asked_for() -> None:
    top = (TopLogprob(token="Par", logprob=-0.1), TopLogprob(token="Lon", logprob=-3.0))
    draft = [Chunk(text="Par", logprobs=(TokenLogprob(token="Par", logprob=-0.1, top=top),))]
    draft.append(Chunk(text="is", logprobs=tokens(-0.3), finish_reason="stop", usage=DRAFT_USAGE))
    assert client_chunks(draft, wanted_logprobs=True, extra_usage=None) == draft


def test_a_kept_drafts_usage_counts_what_earlier_steps_spent() -> None:
    draft = answer()
    earlier = Usage(prompt_tokens=120, completion_tokens=2)
    kept = client_chunks(draft, wanted_logprobs=True, extra_usage=earlier)
    assert kept[0] == draft[0]
    assert kept[-1].usage == Usage(prompt_tokens=129, completion_tokens=6)
    assert kept[-1].text == draft[-1].text and kept[-1].finish_reason == "stop"


async def with_usage_added(chunks: AsyncIterator[Chunk], extra: Usage | None) -> AsyncIterator[Chunk]:
    """A live run's chunks as `SpentBefore` hands them on: the last one's usage counting `extra` too."""
    async for chunk in chunks:
        yield usage_added(chunk, extra)


async def test_the_strong_answers_usage_counts_the_rejected_drafts_tokens() -> None:
    strong = [
        Chunk(text="Paris"),
        Chunk(text=".", finish_reason="stop", usage=Usage(prompt_tokens=9, completion_tokens=2)),
    ]
    added = [chunk async for chunk in with_usage_added(feed(strong), DRAFT_USAGE)]
    assert added[0] == strong[0]
    assert added[-1].usage == Usage(prompt_tokens=18, completion_tokens=8)
    unchanged = [chunk async for chunk in with_usage_added(feed(strong), None)]
    assert unchanged == strong
    # The relay's usage event then adds up to both models' tokens.
    last = json.loads((await events(relay(), added))[-2][len(b"data: ") :])
    assert last["usage"] == {"prompt_tokens": 18, "completion_tokens": 8, "total_tokens": 26}
