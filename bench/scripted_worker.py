"""The scripted worker of `front_door_path.py`: takes every job of the model's stream, answers it at once.

It takes jobs with XREADGROUP, as a worker's consumer does, and answers each with `chunks` chunks
through the worker's own append script (`switchboard/lua/append_chunk.lua`), the last one
acknowledging the job, while it advertises itself with a heartbeat record holding the model warm.
Run in a process of its own (`run_scripted_worker`), so that its CPU is not the front door's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from switchboard import keys, lua
from switchboard.redis_conn import stream_entries
from switchboard.wire import Chunk, Job, SlotStatus, Usage, WorkerRecord, encode, job_decoder
from workers.jobs.writer import inbox_of

MODEL = "tiny"
WORKER_ID = "scripted-worker"
HEARTBEAT_EVERY_S = 2.0


def answer_payloads(chunks: int, tokens: int) -> list[bytes]:
    """The encoded chunks of every answer: `tokens` words over `chunks` chunks, the last with usage."""
    per_chunk = max(1, tokens // chunks)
    texts = ["word " * per_chunk] * chunks
    payloads = [encode(Chunk(text=text)) for text in texts[:-1]]
    last = Chunk(
        text=texts[-1], finish_reason="length", usage=Usage(prompt_tokens=8, completion_tokens=tokens)
    )
    return [*payloads, encode(last)]


def heartbeat_record() -> WorkerRecord:
    """A live worker holding the model warm, as a real worker's heartbeat advertises it."""
    now = time.time()
    slot = SlotStatus(model=MODEL, state="warm", replica=0, warm_since=now, idle_since=now)
    return WorkerRecord(
        id=WORKER_ID,
        host="bench",
        pid=os.getpid(),
        started=now,
        heartbeat=now,
        models=(MODEL,),
        triton_http_port=1,
        triton_grpc_port=2,
        triton_metrics_port=3,
        kind="cpu",
        slots=(slot,),
    )


async def heartbeat(redis: aioredis.Redis) -> None:
    while True:
        await redis.set(keys.worker_record(WORKER_ID), encode(heartbeat_record()), ex=keys.WORKER_TTL_S)
        await redis.zadd(keys.workers_index(), {WORKER_ID: time.time()})
        await asyncio.sleep(HEARTBEAT_EVERY_S)


async def scripted_worker(redis_url: str, chunks: int, tokens: int) -> None:
    """Take every job of the model's stream and answer it at once, as `workers/jobs` would."""
    redis = aioredis.Redis.from_url(redis_url)
    stream = keys.job_stream(MODEL)
    with contextlib.suppress(ResponseError):  # BUSYGROUP: the group exists
        await redis.xgroup_create(stream, keys.JOB_GROUP, id="0", mkstream=True)
    append = lua.register(redis, "append_chunk")
    await redis.script_load(append.script)
    payloads = answer_payloads(chunks, tokens)
    beating = asyncio.create_task(heartbeat(redis))
    while not beating.done():
        response = await redis.xreadgroup(keys.JOB_GROUP, WORKER_ID, {stream: ">"}, count=64, block=1000)
        pipe = redis.pipeline(transaction=False)
        for _, entries in stream_entries(response):
            for entry_id, fields in entries:
                job = job_decoder.decode(fields[keys.JOB_FIELD.encode()])
                queue_answer(pipe, append.sha, job, entry_id, payloads)
        if len(pipe):
            await pipe.execute()
    beating.result()


def queue_answer(pipe: Any, sha: str, job: Job, entry_id: bytes, payloads: list[bytes]) -> None:
    """The job's chunks on `pipe`, as the worker's result writer sends them (one EVALSHA each)."""
    job_id, inbox = job.id, inbox_of(job)
    results, stream = keys.result_stream(job_id), keys.job_stream(MODEL)
    for seq, payload in enumerate(payloads):
        last = seq == len(payloads) - 1
        pipe.evalsha(
            sha,
            5,
            results,
            keys.cancel_mark(job_id),
            stream if last else results,
            keys.job_record(job_id),
            inbox or results,
            payload,
            keys.RESULT_TTL_S,
            int(seq == 0),
            entry_id if last else b"",
            keys.JOB_GROUP,
            seq,
            WORKER_ID,
            int(seq == 0),
            "" if inbox is None else keys.INBOX_MAX_ENTRIES,
            keys.INBOX_TTL_S,
        )


def run_scripted_worker(redis_url: str, chunks: int, tokens: int) -> None:
    asyncio.run(scripted_worker(redis_url, chunks, tokens))
