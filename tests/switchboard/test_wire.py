"""Wire structs: msgpack round-trips, compact encodings, and Chunk.is_last."""

from __future__ import annotations

import msgspec
import pytest

from switchboard.wire import (
    ChatMessage,
    Chunk,
    Job,
    JobError,
    SamplingParams,
    SlotStatus,
    TokenLogprob,
    TopLogprob,
    Usage,
    WorkerRecord,
    chunk_decoder,
    encode,
    job_decoder,
    worker_decoder,
)


def chat_job(**kwargs: object) -> Job:
    fields: dict[str, object] = {
        "id": "job-1",
        "model": "m",
        "sampling": SamplingParams(max_tokens=16, temperature=0.7, top_p=0.9, seed=3, stop=("\n", "END")),
        "messages": (ChatMessage(role="system", content="be brief"), ChatMessage(role="user", content="hi")),
        "created": 1700000000.5,
        "deadline": 1700000600.5,
    }
    fields.update(kwargs)
    return Job(**fields)  # type: ignore[arg-type]


def test_chat_job_round_trip() -> None:
    job = chat_job(tenant="acme", trace={"traceparent": "00-abc-def-01"})
    decoded = job_decoder.decode(encode(job))
    assert decoded == job
    assert isinstance(decoded.messages, tuple)
    assert decoded.messages[1] == ChatMessage(role="user", content="hi")
    assert decoded.sampling.stop == ("\n", "END")
    assert decoded.prompts is None
    assert decoded.trace == {"traceparent": "00-abc-def-01"}


def test_prompt_job_round_trip() -> None:
    job = Job(
        id="j2", model="m", sampling=SamplingParams(), prompts=("Once upon",), created=1.0, deadline=2.0
    )
    decoded = job_decoder.decode(encode(job))
    assert decoded == job
    assert decoded.prompts == ("Once upon",)
    assert decoded.messages is None
    assert decoded.sampling == SamplingParams()
    assert decoded.sampling.max_tokens is None
    assert decoded.sampling.stop == ()
    assert decoded.tenant is None


def test_job_omits_defaults() -> None:
    job = Job(id="j2", model="m", sampling=SamplingParams(), prompts=("p",), created=1.0, deadline=2.0)
    raw = msgspec.msgpack.decode(encode(job))
    assert raw == {
        "id": "j2",
        "model": "m",
        "sampling": {},
        "prompts": ["p"],
        "created": 1.0,
        "deadline": 2.0,
    }


def test_job_requires_its_fields() -> None:
    raw = msgspec.msgpack.encode({"id": "x", "model": "m", "sampling": {}, "created": 1.0})
    with pytest.raises(msgspec.ValidationError, match="deadline"):
        job_decoder.decode(raw)


@pytest.mark.parametrize(
    "chunk",
    [
        Chunk(),
        Chunk(text="hello"),
        Chunk(text="!", finish_reason="stop", usage=Usage(prompt_tokens=5, completion_tokens=9)),
        Chunk(finish_reason="length"),
        Chunk(text="x", index=3, finish_reason="stop"),
        Chunk(error=JobError(code="timeout", message="too slow")),
    ],
)
def test_chunk_round_trip(chunk: Chunk) -> None:
    assert chunk_decoder.decode(encode(chunk)) == chunk


def test_the_job_ends_with_its_usage_or_an_error() -> None:
    usage = Usage(prompt_tokens=1, completion_tokens=1)
    assert Chunk(finish_reason="stop", usage=usage).is_last
    assert Chunk(text="x", index=2, finish_reason="abort", usage=usage).is_last
    assert Chunk(error=JobError(code="engine_error", message="x")).is_last
    # One choice finishing does not end a job of several choices.
    assert not Chunk(text="x", index=1, finish_reason="stop").is_last
    assert not Chunk(text="x").is_last
    assert not Chunk().is_last


def test_logprobs_travel_as_compact_arrays() -> None:
    chunk = Chunk(
        text="ab",
        index=1,
        logprobs=(
            TokenLogprob(token="a", logprob=-0.5, top=(TopLogprob(token="a", logprob=-0.5),)),
            TokenLogprob(token="b", logprob=None),
        ),
    )
    assert chunk_decoder.decode(encode(chunk)) == chunk
    assert msgspec.msgpack.decode(encode(chunk))["logprobs"] == [["a", -0.5, [["a", -0.5]]], ["b", None, []]]


def test_plain_chunk_encoding_is_compact() -> None:
    plain = encode(Chunk(text="abc"))
    full = encode(Chunk(text="abc", finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=2)))
    assert len(plain) < len(full)
    assert msgspec.msgpack.decode(plain) == {"text": "abc"}
    assert msgspec.msgpack.decode(encode(Chunk())) == {}


def test_chunk_rejects_unknown_finish_reason() -> None:
    with pytest.raises(msgspec.ValidationError):
        chunk_decoder.decode(msgspec.msgpack.encode({"finish_reason": "bogus"}))


def test_chunk_rejects_unknown_error_code() -> None:
    with pytest.raises(msgspec.ValidationError):
        chunk_decoder.decode(msgspec.msgpack.encode({"error": {"code": "nope", "message": "x"}}))


def test_worker_record_round_trip() -> None:
    record = WorkerRecord(
        id="w1",
        host="gpu-7",
        pid=1234,
        started=1.5,
        heartbeat=2.5,
        models=("a", "b"),
        triton_http_port=8100,
        triton_grpc_port=8101,
        triton_metrics_port=8102,
    )
    decoded = worker_decoder.decode(encode(record))
    assert decoded == record
    assert decoded.models == ("a", "b")


def test_a_worker_record_that_does_not_say_whether_its_engines_are_ready_counts_as_ready() -> None:
    """Records of workers started before the field existed, during a rolling upgrade."""
    fields = dict(id="w1", host="h", pid=1, started=1.0, heartbeat=2.0, models=())
    fields.update(triton_http_port=1, triton_grpc_port=2, triton_metrics_port=3)
    assert worker_decoder.decode(msgspec.msgpack.encode(fields)).engines_ready
    preparing = WorkerRecord(**fields, engines_ready=False)  # type: ignore[arg-type]
    assert not worker_decoder.decode(encode(preparing)).engines_ready


def test_a_slot_of_an_older_worker_decodes_with_no_waiting_jobs_and_a_newer_one_still_decodes() -> None:
    """Rolling upgrades: `SlotStatus.waiting` is additive, in both directions."""

    class OlderSlotStatus(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
        model: str
        state: str
        in_flight: int = 0

    older = msgspec.msgpack.encode(OlderSlotStatus(model="m", state="warm", in_flight=2))
    assert msgspec.msgpack.decode(older, type=SlotStatus) == SlotStatus(model="m", state="warm", in_flight=2)
    newer = msgspec.msgpack.encode(SlotStatus(model="m", state="warm", in_flight=2, waiting=5))
    assert msgspec.msgpack.decode(newer, type=OlderSlotStatus).in_flight == 2


def test_decoders_reject_the_wrong_struct() -> None:
    with pytest.raises(msgspec.ValidationError):
        worker_decoder.decode(encode(Chunk(text="x")))
    with pytest.raises(msgspec.ValidationError):
        job_decoder.decode(encode(Chunk(text="x")))


def test_wire_structs_are_frozen() -> None:
    chunk = Chunk(text="x")
    with pytest.raises(AttributeError):
        chunk.text = "y"  # type: ignore[misc]
