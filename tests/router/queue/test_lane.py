"""The lane from a worker to a front door on the same machine: chunks reach the request before any
copy of them is in Redis, each once whichever way it also came; only a connection that says the
lane's token is read; the front door advertises its lane while it runs, in a folder of its own."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
import redis.asyncio as aioredis

from router.front_door import FrontDoor
from router.queue.lane import ChunkLane
from router.queue.results import QUIET_S, ResultReader
from router.queue.subscription import Subscription
from router.status.redis_health import RedisHealth
from switchboard import keys
from switchboard.chunk_lane import LaneAddress, chunk_frame, hello, lane_address_decoder
from switchboard.local.redis_server import PrivateRedis
from switchboard.tasks import TaskSet
from switchboard.wire import Chunk, Usage, encode
from tests.support.front_door_harness import MODEL, settings_for
from tests.support.jobs import make_job
from tests.support.waits import eventually
from workers.jobs import lane as worker_lane
from workers.jobs.lane import FrontDoorLanes
from workers.jobs.writer import ResultWriter, inbox_of

LAST = Chunk(finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=2))
ROUTER = "door"


class Door:
    """A front door's reader and lane, advertised as its heartbeat does."""

    def __init__(self, reader: ResultReader, lane: ChunkLane) -> None:
        self.reader = reader
        self.lane = lane
        assert lane.address is not None
        self.address = lane_address_decoder.decode(lane.address)


@pytest.fixture
async def door(redis: aioredis.Redis) -> AsyncIterator[Door]:
    reader = ResultReader(redis, ROUTER, RedisHealth(redis))
    lane = ChunkLane(reader.deliver_copy, reader.wake)
    tasks = TaskSet("test")
    reader.start(tasks)
    await lane.open()
    assert lane.address is not None
    await redis.set(keys.router_lane(ROUTER), lane.address)
    try:
        yield Door(reader, lane)
    finally:
        await lane.close()
        await tasks.stop()


async def next_chunk(subscription: Subscription, within_s: float = 5.0) -> tuple[str, Chunk]:
    return await subscription.get(asyncio.get_running_loop().time() + within_s)


async def connected_lanes(redis: aioredis.Redis, fresh: bool = True) -> FrontDoorLanes:
    """A worker's lanes, with the lane to ROUTER up."""
    lanes = FrontDoorLanes(redis, fresh=lambda: fresh)
    job = make_job(MODEL, "x")
    job = msgspec.structs.replace(job, router_id=ROUTER)
    await eventually(lambda: _sent_nothing_yet(lanes, job), 5, "the lane is up")
    return lanes


async def _sent_nothing_yet(lanes: FrontDoorLanes, job: object) -> bool:
    # A chunk for a job nobody reads: the front door drops it.
    return lanes.send(job, 1, encode(Chunk(text="nobody")))  # type: ignore[arg-type]


class WorkerSide:
    """A worker's lanes, up, and its result writer, which flushes them; a job of the front door's."""

    def __init__(self, lanes: FrontDoorLanes, writer: ResultWriter) -> None:
        self.lanes = lanes
        self.writer = writer
        self.job = msgspec.structs.replace(make_job(MODEL, "x"), router_id=ROUTER)


@pytest.fixture
async def worker(redis: aioredis.Redis, door: Door) -> AsyncIterator[WorkerSide]:
    lanes = await connected_lanes(redis)
    writer = ResultWriter(redis, "w1", before_flush=lanes.flush)
    writer.start()
    side = WorkerSide(lanes, writer)
    await redis.hset(keys.job_record(side.job.id), keys.READERS_FIELD, 1)
    try:
        yield side
    finally:
        await writer.stop()
        await lanes.close()


async def test_a_chunk_on_the_lane_reaches_its_request_before_redis_has_it(
    redis: aioredis.Redis, door: Door
) -> None:
    lanes = await connected_lanes(redis)
    try:
        job = msgspec.structs.replace(make_job(MODEL, "x"), router_id=ROUTER)
        subscription = door.reader.subscribe(job.id, MODEL, from_inbox=True)
        assert lanes.send(job, 1, encode(Chunk(text="a")), served_by="served-name")
        lanes.flush()
        entry_id, chunk = await next_chunk(subscription, QUIET_S / 2)
        assert (entry_id, chunk.text) == ("0-1", "a")
        assert subscription.served_by == "served-name"
        assert not await redis.exists(keys.result_stream(job.id), keys.inbox(ROUTER))
    finally:
        await lanes.close()


async def test_chunks_that_come_both_ways_are_handed_over_once_and_in_order(
    door: Door, worker: WorkerSide
) -> None:
    lanes, writer, job = worker.lanes, worker.writer, worker.job
    subscription = door.reader.subscribe(job.id, MODEL, from_inbox=True)
    chunks = [Chunk(text="a"), Chunk(text="b"), Chunk(text="c"), LAST]
    # The first two come over the lane and through the inbox as well; the third only through the
    # inbox (the lane was behind, say); the last over the lane alone, after the others.
    for seq, chunk in enumerate(chunks[:2]):
        assert lanes.send(job, seq + 1, encode(chunk))
        await writer.append(job.id, encode(chunk), seq=seq, first=seq == 0, inbox=inbox_of(job))
    await writer.append(job.id, encode(chunks[2]), seq=2, inbox=inbox_of(job))
    assert lanes.send(job, 4, encode(LAST))
    lanes.flush()
    got = [await next_chunk(subscription) for _ in chunks]
    assert [(entry_id, chunk.text) for entry_id, chunk in got] == [
        ("0-1", "a"),
        ("0-2", "b"),
        ("0-3", "c"),
        ("0-4", ""),
    ]
    assert got[-1][1].is_last


async def test_a_chunk_that_skips_ahead_on_the_lane_has_the_missing_ones_read_from_the_stream(
    door: Door, worker: WorkerSide
) -> None:
    lanes, writer, job = worker.lanes, worker.writer, worker.job
    subscription = door.reader.subscribe(job.id, MODEL, from_inbox=True)
    started = asyncio.get_running_loop().time()
    # The first chunk went to the stream alone (no copy anywhere), the second over the lane.
    await writer.append(job.id, encode(Chunk(text="a")), seq=0, first=True)
    await writer.append(job.id, encode(LAST), seq=1)
    assert lanes.send(job, 2, encode(LAST))
    lanes.flush()
    assert [(await next_chunk(subscription))[1].text for _ in range(2)] == ["a", ""]
    assert asyncio.get_running_loop().time() - started < QUIET_S


async def test_a_connection_that_does_not_say_the_token_is_closed_unread(door: Door) -> None:
    job_id = "t" * 32
    subscription = door.reader.subscribe(job_id, MODEL, from_inbox=True)
    reader, writer = await asyncio.open_unix_connection(door.address.path)
    try:
        frame = chunk_frame(keys.result_stream(job_id).encode(), 1, encode(Chunk(text="forged")))
        writer.write(hello("not-the-token") + frame)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the front door
        with pytest.raises(TimeoutError):
            await next_chunk(subscription, 0.2)
    finally:
        writer.close()


async def test_a_worker_whose_record_may_have_expired_sends_nothing_on_the_lane(
    redis: aioredis.Redis, door: Door
) -> None:
    fresh = True
    lanes = FrontDoorLanes(redis, fresh=lambda: fresh)
    job = msgspec.structs.replace(make_job(MODEL, "x"), router_id=ROUTER)
    try:
        await eventually(lambda: _sent_nothing_yet(lanes, job), 5, "the lane is up")
        fresh = False
        assert not lanes.send(job, 1, encode(Chunk(text="a")))
    finally:
        await lanes.close()


async def test_a_front_door_with_no_lane_is_asked_again_only_after_a_while(
    redis: aioredis.Redis, door: Door, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_lane, "RETRY_S", 0.3)
    lanes = FrontDoorLanes(redis, fresh=lambda: True)
    job = msgspec.structs.replace(make_job(MODEL, "x"), router_id="elsewhere")
    try:
        await redis.set(
            keys.router_lane("elsewhere"), msgspec.json.encode(LaneAddress("/nowhere/lane.sock", "t"))
        )
        assert not lanes.send(job, 1, b"")  # looked up now, in the background
        await asyncio.sleep(0.1)
        assert not lanes.send(job, 1, b"")  # could not connect: not asked again yet
        # The front door moved its lane here; it is found once the retry is due.
        assert door.lane.address is not None
        await redis.set(keys.router_lane("elsewhere"), door.lane.address)
        started = time.monotonic()
        await eventually(lambda: _sent_nothing_yet(lanes, job), 5, "the lane is up")
        assert time.monotonic() - started >= 0.15
    finally:
        await lanes.close()


async def test_a_front_door_opens_no_lane_unless_asked(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    front_door = await FrontDoor.open(settings_for(redis_server.url))
    try:
        router_id = front_door.reader.inbox_key.split(":")[2]
        await eventually(lambda: redis.exists(keys.router_alive(router_id)), 5, "the heartbeat")
        assert front_door.lane is None
        assert not await redis.exists(keys.router_lane(router_id))
    finally:
        await front_door.close()


async def test_a_front_door_advertises_its_lane_while_it_runs_in_a_folder_of_its_own(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    settings = settings_for(redis_server.url)
    settings.router.chunk_lane = True
    front_door = await FrontDoor.open(settings)
    try:
        router_id = front_door.reader.inbox_key.split(":")[2]
        await eventually(lambda: redis.exists(keys.router_lane(router_id)), 5, "the lane advertised")
        address = lane_address_decoder.decode(await redis.get(keys.router_lane(router_id)))
        folder = Path(address.path).parent
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        assert stat.S_ISSOCK(os.stat(address.path).st_mode)
    finally:
        await front_door.close()
    assert not await redis.exists(keys.router_lane(router_id))
    with pytest.raises(FileNotFoundError):
        os.stat(folder)


async def test_the_chunks_sent_on_the_lane_leave_with_the_result_writers_next_batch(
    door: Door, worker: WorkerSide
) -> None:
    job = worker.job
    subscription = door.reader.subscribe(job.id, MODEL, from_inbox=True)
    started = asyncio.get_running_loop().time()
    assert worker.lanes.send(job, 1, encode(Chunk(text="a")))
    with pytest.raises(TimeoutError):
        await next_chunk(subscription, 0.1)  # held until the writer's batch leaves
    # Appended without an inbox copy, as a worker does once the lane took the chunk.
    await worker.writer.append(job.id, encode(Chunk(text="a")), seq=0, first=True)
    entry_id, chunk = await next_chunk(subscription)
    assert (entry_id, chunk.text) == ("0-1", "a")
    assert asyncio.get_running_loop().time() - started < QUIET_S  # not read from the stream
