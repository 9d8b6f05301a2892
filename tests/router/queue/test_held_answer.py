"""A held answer replays a finished job's chunks through the stream and whole-answer relays, byte for
byte as the live job's run would; `collect` reads a live run whole, or gives up at its bound."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import pytest
import redis.asyncio as aioredis
from litestar.response import Stream

from router.admission.auth import ANONYMOUS
from router.front_door import FrontDoor
from router.intake.job import chat_job
from router.intake.resume import resume_point
from router.intake.tools import TEXT
from router.openai.chat import ChatCompletionRequest
from router.openai.errors import EngineError, InvalidRequestError, OpenAIError
from router.queue.chunk_source import ChunkSource
from router.queue.held_answer import HeldAnswer, collect
from router.queue.run import JobRun
from router.relay.answer import served_chunks
from router.relay.chat import ChatRelay, chat_relay
from router.relay.first_byte import OPENAI_SHAPE, StreamForm, stream_response
from router.telemetry.job_observer import FrontDoorJobObserver
from switchboard import keys
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import Chunk, Job, JobError, Usage
from tests.support.front_door_harness import BODY, MODEL, settings_for, write_chunks

ANSWER = [
    Chunk(text="Hel"),
    Chunk(text="lo", index=1),
    Chunk(text=" world", finish_reason="stop"),
    Chunk(text="!", index=1, finish_reason="length", usage=Usage(prompt_tokens=4, completion_tokens=5)),
]
REQUEST = msgspec.convert(
    {**BODY, "n": 2, "stream": True, "stream_options": {"include_usage": True}}, ChatCompletionRequest
)


@pytest.fixture
async def front_door(redis: aioredis.Redis, redis_server: PrivateRedis) -> AsyncIterator[FrontDoor]:
    door = await FrontDoor.open(settings_for(redis_server.url, first_byte_budget_s=2.0))
    try:
        yield door
    finally:
        await door.close()


async def live_run(
    front_door: FrontDoor, *chunks: Chunk, timeout_s: float = 30, streamed: bool = False
) -> JobRun:
    """A queued job's run, whose worker wrote `chunks` (as a worker's result writer would)."""
    job = chat_job(REQUEST, timeout_s=timeout_s)
    run = await front_door.runs.start(
        job,
        front_door.admission.admitting(job, ANONYMOUS),
        FrontDoorJobObserver(job, front_door.runs.observations),
    )
    if streamed:
        # Before the chunks are written: the reader may read them to the end at once.
        run.mark_resumable()
    await write_chunks(front_door.redis, job.id, *chunks)
    return run


async def held_of(front_door: FrontDoor, *chunks: Chunk, streamed: bool = False) -> HeldAnswer:
    """The answer of a live run, read whole and held (the run closed, as a cascade does); a
    `streamed` run's results are kept a while after it was read to its end."""
    run = await live_run(front_door, *chunks, streamed=streamed)
    try:
        read = await collect(run, within_s=10)
    finally:
        await run.close()
    assert read == list(chunks)
    return HeldAnswer(run.job, read, served_model=run.served_model)


def relay_for(job: Job) -> ChatRelay:
    return chat_relay(REQUEST, job, TEXT)


async def body(
    front_door: FrontDoor, source: ChunkSource, relay: ChatRelay, form: StreamForm = OPENAI_SHAPE
) -> bytes:
    response = await stream_response(source, relay, front_door.settings.router, front_door.status, form)
    assert isinstance(response, Stream)
    events = response.iterator
    assert isinstance(events, AsyncIterator)
    return b"".join([event if isinstance(event, bytes) else event.encode() async for event in events])


async def test_a_held_answer_streams_the_same_events_as_its_live_run(front_door: FrontDoor) -> None:
    live = await live_run(front_door, *ANSWER)
    held = await held_of(front_door, *ANSWER)
    # One relay's framing for both (the completion's id is its job's).
    streamed_live = await body(front_door, live, relay_for(live.job))
    streamed_held = await body(front_door, held, relay_for(live.job))
    assert streamed_held == streamed_live
    assert streamed_held.count(b"data: ") == 6  # four chunks, the usage event, [DONE]
    assert held.ended


async def test_a_held_answer_is_assembled_as_its_live_run_is(front_door: FrontDoor) -> None:
    live = await live_run(front_door, *ANSWER)
    held = await held_of(front_door, *ANSWER)
    try:
        whole_live = await relay_for(live.job).assemble(served_chunks(live, relay_for(live.job)))
    finally:
        await live.close()
    relay = relay_for(live.job)
    whole_held = await relay.assemble(served_chunks(held, relay))  # type: ignore[arg-type]
    assert msgspec.json.encode(whole_held) == msgspec.json.encode(whole_live)
    assert whole_held.usage.total_tokens == 9


async def test_a_held_answers_event_ids_name_no_entry_and_a_resume_from_one_is_refused(
    front_door: FrontDoor,
) -> None:
    held = await held_of(front_door, *ANSWER, streamed=True)
    streamed = await body(front_door, held, relay_for(held.job), StreamForm(event_ids=True))
    ids = [line for line in streamed.split(b"\n") if line.startswith(b"id: ")]
    assert ids == [f"id: {held.job.id}:0-{n}".encode() for n in (1, 2, 3, 4, 4, 4)]
    # The draft's results are kept (its run was streamed), yet a client that resumes from the held
    # answer's event is told to ask again, rather than relayed some other point of them.
    assert await front_door.redis.ttl(keys.result_stream(held.job.id)) > 0
    point = resume_point(f"{held.job.id}:0-2", stream=True)
    assert point is not None and not point.counted
    ticket = await front_door.admission.admit(held.job, ANONYMOUS)
    with pytest.raises(InvalidRequestError) as refused:
        await front_door.runs.resume(
            held.job, ticket, point.entry_id, FrontDoorJobObserver(held.job, front_door.runs.observations)
        )
    assert refused.value.code == "invalid_last_event_id"


async def test_a_held_answer_hands_its_chunks_out_once_at_once() -> None:
    job = chat_job(REQUEST, timeout_s=30)
    held = HeldAnswer(job, ANSWER, served_model="tiny-v2")
    assert (held.job, held.served_model, held.ended, held.last_entry_id) == (job, "tiny-v2", False, "0-0")
    held.mark_resumable()  # nothing to keep: it changes nothing
    first = await held.wait_chunk(within_s=0)
    assert first == ANSWER[0]
    assert held.last_entry_id == "0-1"
    assert [chunk async for chunk in held.chunks(first)] == ANSWER
    assert held.ended and held.last_entry_id == "0-4"
    assert await held.wait_chunk(within_s=5) is None
    assert [chunk async for chunk in held.chunks()] == []
    await held.close()
    await held.close()
    # Read from its start, as the whole-answer relay does.
    assert [chunk async for chunk in HeldAnswer(job, ANSWER, served_model="m").chunks()] == ANSWER


async def test_a_held_answer_that_failed_is_refused_with_its_status_before_any_byte(
    front_door: FrontDoor,
) -> None:
    job = chat_job(REQUEST, timeout_s=30)
    held = HeldAnswer(job, [Chunk(error=JobError(code="engine_error", message="boom"))], served_model=MODEL)
    with pytest.raises(EngineError, match="boom"):
        await stream_response(held, relay_for(job), front_door.settings.router, front_door.status)


async def test_collect_gives_up_at_its_bound_and_the_closed_run_cancels_the_job(
    front_door: FrontDoor,
) -> None:
    run = await live_run(front_door, Chunk(text="a slow dr"))
    try:
        started = asyncio.get_running_loop().time()
        assert await collect(run, within_s=0.3) is None
        assert asyncio.get_running_loop().time() - started == pytest.approx(0.3, abs=0.2)
    finally:
        await run.close()
    assert await front_door.redis.exists(keys.cancel_mark(run.job.id))


async def test_collect_returns_a_failed_jobs_error_chunk_and_raises_its_runs_errors(
    front_door: FrontDoor,
) -> None:
    failure = Chunk(error=JobError(code="engine_error", message="boom"))
    run = await live_run(front_door, Chunk(text="Hel"), failure)
    try:
        assert await collect(run, within_s=10) == [Chunk(text="Hel"), failure]
    finally:
        await run.close()
    # The job's deadline passes before the bound: the run's own error (no worker alive here).
    run = await live_run(front_door, timeout_s=0.3)
    try:
        with pytest.raises(OpenAIError) as late:
            await collect(run, within_s=10)
        assert late.value.status_code in (503, 504)
    finally:
        await run.close()
