"""The generator's Triton model on its own: a job aborted on its way to the engine ends as it arrives;
the engine holds as many tokens per output as the coalescing window leaves room for."""

from __future__ import annotations

import asyncio

import msgspec

from switchboard.wire import ChatMessage, Chunk, chunk_decoder, encode
from tests.support.jobs import make_job
from tests.support.scripted_engine import ScriptedEngine
from workers.triton.engine_job import engine_job_decoder
from workers.triton.generator.model import (
    EARLY_ABORTS_KEPT,
    CoalescingPolicy,
    GeneratorModel,
    engine_requests,
)

NO_WAIT = CoalescingPolicy(min_window_s=0.0, max_window_s=0.0, max_chunks_per_s=1e6)


def on_this_loop(engine: ScriptedEngine) -> GeneratorModel:
    callable_ = GeneratorModel(engine, NO_WAIT)
    callable_.attach_loop(asyncio.get_running_loop())
    return callable_


async def run(callable_: GeneratorModel, prompt: str, job_id: str | None = None) -> tuple[str, list[Chunk]]:
    job = make_job("scripted", prompt)
    if job_id is not None:
        job = msgspec.structs.replace(job, id=job_id)
    chunks = [chunk_decoder.decode(r) async for r in callable_.serve(encode(job), stream=0, tag=None)]
    return job.id, chunks


async def test_a_job_aborted_before_it_arrives_ends_at_once_without_reaching_the_engine() -> None:
    engine = ScriptedEngine()
    callable_ = on_this_loop(engine)
    await asyncio.wrap_future(callable_.abort("early", arriving=True))
    job_id, chunks = await run(callable_, "fast 3", job_id="early")
    assert [(c.finish_reason, c.is_last) for c in chunks] == [("abort", True)]
    assert job_id not in engine.requests
    # Remembered once: the same job arriving again (put back in line) runs.
    _, again = await run(callable_, "fast 3", job_id="early")
    assert "".join(c.text for c in again) == "t0\x00 t1\x00 t2\x00 "


async def test_a_plain_abort_of_a_job_not_running_here_is_not_remembered() -> None:
    # A job aborted for another reason (superseded, a failed write) may come back to this worker
    # put back in line, and must run then.
    engine = ScriptedEngine()
    callable_ = on_this_loop(engine)
    await asyncio.wrap_future(callable_.abort("elsewhere"))
    _, chunks = await run(callable_, "fast 2", job_id="elsewhere")
    assert [c.finish_reason for c in chunks] == [None, "length"]
    assert engine.requests == ["elsewhere"]


async def test_only_the_latest_early_aborts_are_kept() -> None:
    engine = ScriptedEngine()
    callable_ = on_this_loop(engine)
    for n in range(EARLY_ABORTS_KEPT + 1):
        await asyncio.wrap_future(callable_.abort(f"job-{n}", arriving=True))
    _, oldest = await run(callable_, "fast 1", job_id="job-0")
    _, newest = await run(callable_, "fast 1", job_id=f"job-{EARLY_ABORTS_KEPT}")
    assert oldest[-1].finish_reason == "length", "the oldest was forgotten and runs"
    assert [c.finish_reason for c in newest] == ["abort"]


async def test_once_a_pace_is_measured_the_engine_holds_what_half_a_window_brings() -> None:
    engine = ScriptedEngine()
    window = CoalescingPolicy(min_window_s=0.2, max_window_s=0.2, max_chunks_per_s=1e6)
    callable_ = GeneratorModel(engine, window)
    callable_.attach_loop(asyncio.get_running_loop())
    # Tokens 10 ms apart: the first goes at once, the other five with the last.
    _, chunks = await run(callable_, "slow 6 0.01")
    assert len(chunks) == 2
    _, again = await run(callable_, "slow 3 0.01")
    assert "".join(c.text for c in again) == "t0\x00 t1\x00 t2\x00 "
    first, second = engine.output_every
    assert first == 1, "nothing measured yet: every token is handed over"
    # Half of 200 ms at about 10 ms a token (a slower machine only lowers it).
    assert 3 <= second <= 10


async def test_without_a_window_every_token_is_handed_over() -> None:
    engine = ScriptedEngine()
    callable_ = on_this_loop(engine)
    for _ in range(3):
        await run(callable_, "slow 4 0.005")
    assert engine.output_every == [1, 1, 1]


def test_every_engine_request_of_a_job_carries_its_cache_salt() -> None:
    """A job's prefix-cache salt reaches the engine with each of its requests (one per prompt)."""
    one = msgspec.structs.replace(make_job("m", "Hi"), cache_salt="k1:s")
    several = msgspec.structs.replace(one, prompts=("a", "b"))
    chat = msgspec.structs.replace(one, prompts=None, messages=(ChatMessage(role="user", content="Hi"),))
    for job in (one, several, chat):
        requests = engine_requests(engine_job_decoder.decode(encode(job)))
        assert [request.cache_salt for request in requests] == ["k1:s"] * len(requests)
    assert engine_requests(engine_job_decoder.decode(encode(make_job("m", "Hi"))))[0].cache_salt is None
