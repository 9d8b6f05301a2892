"""Helpers shared by the front-door tests: settings, the app on a real port, worker-side records.

The tests play the worker's part by writing into Redis what a worker would (its heartbeat record,
result chunks, failure marks, measured costs), so the front door is exercised against real Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import httpx
import redis.asyncio as aioredis
import uvicorn

from router.app import create_app
from router.front_door import FrontDoor
from router.server import server_config
from switchboard import keys
from switchboard.config import ModelConfig, Settings
from switchboard.wire import Chunk, Job, SlotStatus, Usage, WorkerRecord, encode, job_decoder

MODEL = "tiny"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


def settings_for(
    redis_url: str,
    timeout_s: float = 30.0,
    *,
    first_byte_budget_s: float = 2.0,
    load_progress_every_s: float = 5.0,
    models: list[ModelConfig] | None = None,
    resume_grace_s: float | None = None,
) -> Settings:
    settings = Settings(models=models or [ModelConfig(name=MODEL, path="/nonexistent")])
    settings.redis.url = redis_url
    settings.router.request_timeout_s = timeout_s
    settings.router.first_byte_budget_s = first_byte_budget_s
    settings.router.load_progress_every_s = load_progress_every_s
    if resume_grace_s is not None:
        settings.router.resume_grace_s = resume_grace_s
    return settings


@contextlib.asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The front door on a real HTTP port, in this test's event loop, and a client for it."""
    # The front door's own server settings (its limits on slow clients among them), on any free port.
    server = uvicorn.Server(server_config(create_app(settings), settings, port=0))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():  # it failed to start: show why instead of waiting forever
            task.result()
            raise RuntimeError("the front door stopped before it started")
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            yield client
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def front_door_of(settings: Settings) -> AsyncIterator[FrontDoor]:
    """A front door's parts, opened on `settings` without an HTTP server, and closed after."""
    door = await FrontDoor.open(settings)
    try:
        yield door
    finally:
        await door.close()


def worker_record(worker_id: str, *slots: SlotStatus, host: str = "box", kind: str = "cpu") -> WorkerRecord:
    """A live worker's heartbeat record holding `slots`."""
    now = time.time()
    return WorkerRecord(
        id=worker_id,
        host=host,
        pid=1,
        started=now - 60,
        heartbeat=now,
        models=tuple(s.model for s in slots if s.state == "warm"),
        triton_http_port=1,
        triton_grpc_port=2,
        triton_metrics_port=3,
        kind=kind,
        slots=slots,
    )


async def advertise(redis: aioredis.Redis, *records: WorkerRecord) -> None:
    """Write heartbeat records and index them, as a worker's heartbeat does."""
    for record in records:
        await redis.set(keys.worker_record(record.id), encode(record), ex=keys.WORKER_TTL_S)
        await redis.zadd(keys.workers_index(), {record.id: time.time()})


async def record_load_times(redis: aioredis.Redis, model: str, kind: str, *seconds: float) -> None:
    """Measured load times, oldest first (each LPUSH'ed, so the list reads newest first)."""
    for value in seconds:
        await redis.lpush(keys.measured_costs(model, kind, "load"), str(value))


async def next_job(redis: aioredis.Redis, model: str = MODEL, timeout_s: float = 10.0) -> Job:
    """Wait for the next job enqueued for `model` (read without a consumer group: nothing is taken)."""
    last_id = b"0-0"
    async with asyncio.timeout(timeout_s):
        while True:
            response = await redis.xread({keys.job_stream(model): last_id}, block=100)
            for _, entries in response or ():
                return job_decoder.decode(entries[0][1][keys.JOB_FIELD.encode()])


# A worker's append script's part the front door sees (switchboard/lua/append_chunk.lua): each chunk
# on the job's result stream and a copy in the inboxes given, then the stream's expiry.
_WRITE_CHUNKS = """
for i = 2, #ARGV do
  local id = redis.call('XADD', KEYS[1], '*', 'c', ARGV[i])
  for k = 2, #KEYS do
    redis.call('XADD', KEYS[k], '*', 'r', KEYS[1], 'e', id, 'c', ARGV[i])
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
"""


async def write_chunks(redis: aioredis.Redis, job_id: str, *chunks: Chunk) -> None:
    """Append result chunks as a worker's result writer does: with the stream's expiry, at once (its
    script does both in one step; an expiry set a round trip later could undo the shorter one a front
    door sets when it has read the stream to its end), each copied to the inbox of the front door that
    queued the job: here, of every front door running."""
    inboxes = [keys.inbox(router_id) for router_id in await running_front_doors(redis)]
    await redis.eval(  # type: ignore[misc]
        _WRITE_CHUNKS,
        1 + len(inboxes),
        keys.result_stream(job_id),
        *inboxes,
        keys.RESULT_TTL_S,
        *(encode(chunk) for chunk in chunks),
    )


async def running_front_doors(redis: aioredis.Redis) -> list[str]:
    """The ids of the front doors whose heartbeat is in Redis."""
    head, tail = keys.router_alive("\0").split("\0")
    return [
        key.decode()[len(head) : -len(tail)]
        async for key in redis.scan_iter(match=keys.router_alive("*"), count=1000)
    ]


async def answer_ok(redis: aioredis.Redis, job_id: str) -> None:
    """Answer the job in one chunk, "ok", as a worker that served it would."""
    await write_chunks(
        redis,
        job_id,
        Chunk(text="ok", finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=1)),
    )
