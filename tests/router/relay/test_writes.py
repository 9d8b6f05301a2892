"""A stream writes the events of the chunks that are here in one write (each write is a send through
the ASGI layers and a system call), and never waits for a chunk to write what it has; against a real
Redis and the front door's own result reader."""

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
from router.intake.tools import TEXT
from router.openai.chat import ChatCompletionRequest
from router.queue.run import JobRun
from router.relay.chat import chat_relay
from router.relay.first_byte import StreamForm, stream_response
from router.telemetry.job_observer import FrontDoorJobObserver
from switchboard import keys
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import Chunk, Usage, encode
from tests.support.front_door_harness import BODY, front_door_of, settings_for

ANSWER = [
    Chunk(text="Hel"),
    Chunk(text="lo"),
    Chunk(text=" world"),
    Chunk(text="!", finish_reason="stop", usage=Usage(prompt_tokens=4, completion_tokens=4)),
]
REQUEST = msgspec.convert(
    {**BODY, "stream": True, "stream_options": {"include_usage": True}}, ChatCompletionRequest
)


@pytest.fixture
async def front_door(redis: aioredis.Redis, redis_server: PrivateRedis) -> AsyncIterator[FrontDoor]:
    async with front_door_of(settings_for(redis_server.url)) as door:
        yield door


async def started_run(front_door: FrontDoor) -> JobRun:
    job = chat_job(REQUEST, timeout_s=30)
    return await front_door.runs.start(
        job,
        front_door.admission.admitting(job, ANONYMOUS),
        FrontDoorJobObserver(job, front_door.runs.observations),
    )


async def write_at_once(redis: aioredis.Redis, job_id: str, *chunks: Chunk, first_position: int = 0) -> None:
    """Append `chunks` in one transaction: a reader finds them all or none."""
    pipe = redis.pipeline(transaction=True)
    for position, chunk in enumerate(chunks, start=first_position + 1):
        pipe.xadd(keys.result_stream(job_id), {keys.CHUNK_FIELD: encode(chunk)}, id=f"0-{position}")
    await pipe.execute()


async def writes_of(front_door: FrontDoor, run: JobRun, form: StreamForm) -> AsyncIterator[bytes]:
    relay = chat_relay(REQUEST, run.job, TEXT)
    response = await stream_response(run, relay, front_door.settings.router, front_door.status, form)
    assert isinstance(response, Stream)
    writes = response.iterator
    assert isinstance(writes, AsyncIterator)
    return writes


@pytest.mark.parametrize("event_ids", [False, True])
async def test_the_chunks_that_are_here_go_out_in_one_write(front_door: FrontDoor, event_ids: bool) -> None:
    run = await started_run(front_door)
    await write_at_once(front_door.redis, run.job.id, *ANSWER)
    writes = [write async for write in await writes_of(front_door, run, StreamForm(event_ids=event_ids))]
    assert len(writes) == 1, writes
    (written,) = writes
    assert written.count(b"data: ") == 6  # four chunks, the usage event, [DONE]
    assert written.endswith(b"data: [DONE]\n\n")
    if event_ids:  # each event names the chunk it came from
        ids = [line for line in written.split(b"\n") if line.startswith(b"id: ")]
        assert ids == [f"id: {run.job.id}:0-{n}".encode() for n in (1, 2, 3, 4, 4, 4)]


async def test_what_is_here_is_written_without_waiting_for_the_next_chunk(front_door: FrontDoor) -> None:
    run = await started_run(front_door)
    await write_at_once(front_door.redis, run.job.id, ANSWER[0])
    writes = await writes_of(front_door, run, StreamForm())
    async with asyncio.timeout(5):
        first = await anext(writes)
    assert first.count(b"data: ") == 1 and b"Hel" in first
    await write_at_once(front_door.redis, run.job.id, *ANSWER[1:], first_position=1)
    rest = b"".join([write async for write in writes])
    assert rest.count(b"data: ") == 5
