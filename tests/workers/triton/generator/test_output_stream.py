"""A model's output stream: every job's chunks on one request, paced, none lost, mixed or reordered."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import AsyncIterator

import msgspec

from switchboard.wire import chunk_decoder, encode
from tests.support.jobs import make_job
from tests.support.scripted_engine import ScriptedEngine
from workers.triton.generator.model import CoalescingPolicy, GeneratorModel
from workers.triton.generator.output_stream import (
    CLOSE_OUTPUT,
    OPEN_OUTPUT,
    OutputStream,
    OutputStreams,
    Posted,
    posted_batch_decoder,
)

GAP_S = 0.05


async def next_batch(batches: object) -> list[Posted]:
    return await asyncio.wait_for(anext(batches), 1.0)  # type: ignore[call-overload, no-any-return]


async def test_a_chunk_after_a_quiet_spell_leaves_at_once() -> None:
    stream = OutputStream(gap_s=GAP_S)
    batches = stream.listen()
    stream.post(1, b"a", last=False, urgent=False)
    started = time.perf_counter()
    assert await next_batch(batches) == [Posted(1, b"a", False)]
    assert time.perf_counter() - started < GAP_S / 2


async def test_chunks_that_come_within_the_gap_share_one_batch() -> None:
    stream = OutputStream(gap_s=GAP_S)
    batches = stream.listen()
    stream.post(1, b"a", last=False, urgent=False)
    await next_batch(batches)
    started = time.perf_counter()
    stream.post(1, b"b", last=False, urgent=False)
    stream.post(2, b"x", last=False, urgent=False)
    batch = await next_batch(batches)
    assert time.perf_counter() - started >= GAP_S * 0.8, "held for the rest of the gap"
    assert batch == [Posted(1, b"b", False), Posted(2, b"x", False)]


async def test_a_jobs_first_and_last_chunks_never_wait_for_the_gap() -> None:
    stream = OutputStream(gap_s=10.0)
    batches = stream.listen()
    stream.post(1, b"a", last=False, urgent=True)
    await next_batch(batches)
    stream.post(1, b"b", last=False, urgent=False)
    stream.post(2, b"first of 2", last=False, urgent=True)
    assert await next_batch(batches) == [Posted(1, b"b", False), Posted(2, b"first of 2", False)]
    stream.post(1, b"end", last=True, urgent=False)
    assert await next_batch(batches) == [Posted(1, b"end", True)]


async def test_a_newer_client_stream_closes_the_older_ones_output() -> None:
    streams = OutputStreams(gap_s=GAP_S)
    older = streams.of(0)
    waiting = asyncio.ensure_future(anext(older.listen()))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    newer = streams.of(1)
    assert streams.of(1) is newer
    newer.post(3, b"c", last=False, urgent=False)
    assert await next_batch(newer.listen()) == [Posted(3, b"c", False)]
    try:
        await asyncio.wait_for(waiting, 1.0)
        raise AssertionError("the older stream's listener should have ended")
    except StopAsyncIteration:
        pass
    late = streams.of(0)
    late.post(4, b"nobody reads this", last=True, urgent=True)
    assert [batch async for batch in late.listen()] == [], "a replaced stream's output is closed"


async def test_close_ends_the_listener() -> None:
    stream = OutputStream(gap_s=GAP_S)
    batches = stream.listen()
    waiting = asyncio.ensure_future(anext(batches))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    stream.close()
    try:
        await asyncio.wait_for(waiting, 1.0)
        raise AssertionError("a closed output stream should end its listener")
    except StopAsyncIteration:
        pass


def tagged(callable_: GeneratorModel, prompt: str, tag: int) -> AsyncIterator[bytes]:
    return callable_.serve(encode(make_job("scripted", prompt)), stream=0, tag=tag)


async def test_many_jobs_chunks_ride_shared_responses_each_to_its_own_job_in_order() -> None:
    policy = CoalescingPolicy(min_window_s=0.02, max_window_s=0.02, max_chunks_per_s=1e6)
    callable_ = GeneratorModel(ScriptedEngine(), policy)
    callable_.attach_loop(asyncio.get_running_loop())
    received: dict[int, list[str]] = defaultdict(list)
    ended: set[int] = set()
    responses = 0
    counts = {tag: 5 + 3 * tag for tag in range(8)}

    async def listen() -> None:
        nonlocal responses
        async for response in callable_.serve(OPEN_OUTPUT, stream=0, tag=None):
            responses += 1
            for posted in posted_batch_decoder.decode(response):
                assert posted.tag not in ended, "nothing after a job's last chunk"
                chunk = chunk_decoder.decode(posted.chunk)
                received[posted.tag].append(chunk.text)
                assert posted.last == chunk.is_last
                if posted.last:
                    ended.add(posted.tag)

    async def job(tag: int) -> None:
        own = [r async for r in tagged(callable_, f"slow {counts[tag]} 0.005", tag)]
        assert own == [], "a tagged job's chunks go to the output stream, not to its own request"

    listener = asyncio.create_task(listen())
    await asyncio.gather(*(job(tag) for tag in counts))
    await asyncio.sleep(0.05)
    await callable_.stop_engine()
    await asyncio.wait_for(listener, 1.0)
    assert ended == set(counts)
    for tag, count in counts.items():
        assert "".join(received[tag]) == "".join(f"t{i}\x00 " for i in range(count))
    chunks = sum(len(texts) for texts in received.values())
    assert responses < chunks / 2, f"{chunks} chunks should share responses, got {responses}"


async def test_an_untagged_request_gets_its_chunks_as_its_own_responses() -> None:
    callable_ = GeneratorModel(
        ScriptedEngine(), CoalescingPolicy(min_window_s=0, max_window_s=0, max_chunks_per_s=1e6)
    )
    callable_.attach_loop(asyncio.get_running_loop())
    job = make_job("scripted", "fast 3")
    chunks = [chunk_decoder.decode(r) async for r in callable_.serve(encode(job), stream=0, tag=None)]
    assert "".join(c.text for c in chunks) == "t0\x00 t1\x00 t2\x00 "
    assert chunks[-1].is_last and msgspec.structs.asdict(chunks[-1])["usage"] is not None


async def test_a_close_request_ends_its_streams_output_request_and_any_opened_after_it() -> None:
    """A client elsewhere ends its output stream's request before its stream ends, so that Triton
    need not cancel a request (it may wait on a cancelled one forever)."""
    callable_ = GeneratorModel(
        ScriptedEngine(), CoalescingPolicy(min_window_s=0, max_window_s=0, max_chunks_per_s=1e6)
    )
    callable_.attach_loop(asyncio.get_running_loop())
    listening = asyncio.create_task(anext(callable_.serve(OPEN_OUTPUT, stream=3, tag=None), None))
    other = asyncio.create_task(anext(callable_.serve(OPEN_OUTPUT, stream=4, tag=None), None))
    await asyncio.sleep(0.05)
    assert [r async for r in callable_.serve(CLOSE_OUTPUT, stream=4, tag=None)] == []
    assert await asyncio.wait_for(other, 1.0) is None, "the closed stream's request ends, answered"
    assert listening.done(), "an older stream was ended by the newer one already"
    late = [r async for r in callable_.serve(OPEN_OUTPUT, stream=4, tag=None)]
    assert late == [], "a request of the closed stream that comes late ends at once"
    await callable_.stop_engine()
