"""The worker's path against a real Triton (PyTriton) and a real Redis, with a scripted engine.

The engine is the only stand-in: it streams deltas on a script named in the job's prompt, so the
model slot, the consumer, the Triton model (decoupled, coalescing), the result writer and the
acknowledgements are all exercised for real and fast. The real engine is covered end to end in tests/e2e.
"""

from __future__ import annotations

import asyncio

import pytest

from switchboard import keys
from tests.support.jobs import result, submit
from tests.support.one_worker import MODEL, Worker, job

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_a_job_streams_through_triton_and_is_acknowledged(worker: Worker) -> None:
    one = job("slow 5 0.1")
    await submit(worker.redis, one)
    chunks = await result(worker.redis, one.id)
    assert "".join(c.text for c in chunks) == "".join(f"t{i}\x00 " for i in range(5))
    # Deltas 100 ms apart, window 50 ms: each travels alone, none waits for the next.
    assert len(chunks) == 5
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    await asyncio.sleep(0.1)
    assert await worker.redis.xlen(keys.job_stream(MODEL)) == 0
    assert (await worker.redis.xpending(keys.job_stream(MODEL), keys.JOB_GROUP))["pending"] == 0
    assert 0 < await worker.redis.ttl(keys.result_stream(one.id)) <= keys.RESULT_TTL_S


async def test_fast_tokens_travel_as_few_chunks(worker: Worker) -> None:
    one = job("fast 400")
    await submit(worker.redis, one)
    chunks = await result(worker.redis, one.id)
    assert "".join(c.text for c in chunks) == "".join(f"t{i}\x00 " for i in range(400))
    assert len(chunks) < 40, f"{len(chunks)} chunks for 400 tokens that arrived together"
