"""Delta coalescing: slow streams pass through at once, fast streams are grouped per window."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import cast

import pytest

from switchboard.wire import FinishReason
from workers.engines.base import Delta
from workers.triton.generator.coalesce import DeltaInbox, coalesce, merge


class OneChoiceStream:
    """The coalesced stream of a one-choice request: one merged delta per chunk."""

    def __init__(self, queue: DeltaInbox, window_s: float) -> None:
        self._chunks = cast(AsyncGenerator[list[Delta], None], coalesce(queue, lambda: window_s))

    def __aiter__(self) -> OneChoiceStream:
        return self

    async def __anext__(self) -> Delta:
        (delta,) = await anext(self._chunks)
        return delta

    async def aclose(self) -> None:
        await self._chunks.aclose()


def open_stream(queue: DeltaInbox, window_s: float) -> OneChoiceStream:
    return OneChoiceStream(queue, window_s)


def d(
    text: str, n: int = 1, finish: FinishReason | None = None, index: int = 0, last: bool | None = None
) -> Delta:
    last = finish is not None if last is None else last
    return Delta(
        text=text, prompt_tokens=5, completion_tokens=n, index=index, finish_reason=finish, last=last
    )


def test_merge_single_is_unchanged() -> None:
    delta = d("x", 3)
    assert merge([delta]) == [delta]


def test_merge_joins_texts_and_keeps_last_counts() -> None:
    (merged,) = merge(
        [
            Delta(text="a", prompt_tokens=1, completion_tokens=1),
            Delta(text="b", prompt_tokens=2, completion_tokens=2),
            Delta(text="c", prompt_tokens=3, completion_tokens=7, finish_reason="length", last=True),
        ]
    )
    assert merged.text == "abc"
    assert merged.prompt_tokens == 3
    assert merged.completion_tokens == 7
    assert merged.finish_reason == "length"
    assert merged.last


def test_merge_without_finish() -> None:
    (merged,) = merge([d("a", 1), d("", 2), d("b", 3)])
    assert merged.text == "ab"
    assert merged.completion_tokens == 3
    assert merged.finish_reason is None


def test_merge_keeps_choices_apart_and_the_last_delta_last() -> None:
    merged = merge(
        [
            d("a", 1, index=0),
            d("x", 2, index=1),
            d("b", 3, index=0, finish="stop", last=False),
            d("y", 4, index=1, finish="length", last=True),
        ]
    )
    assert [(m.index, m.text, m.finish_reason, m.last) for m in merged] == [
        (0, "ab", "stop", False),
        (1, "xy", "length", True),
    ]
    assert merged[-1].completion_tokens == 4


def test_merge_orders_choices_by_their_last_delta() -> None:
    merged = merge([d("a", 1, index=1), d("x", 2, index=0), d("b", 3, index=1, finish="stop")])
    assert [m.index for m in merged] == [0, 1]
    assert merged[-1].last


async def test_lone_delta_is_not_delayed() -> None:
    queue: DeltaInbox = DeltaInbox()
    stream = open_stream(queue, 0.5)
    try:
        queue.put_nowait(d("hi"))
        start = time.monotonic()
        first = await asyncio.wait_for(anext(stream), 5)
        assert time.monotonic() - start < 0.25
        assert first.text == "hi"
        assert first.finish_reason is None
    finally:
        await stream.aclose()


async def test_the_first_text_after_an_empty_first_delta_is_not_delayed() -> None:
    """A first token that decodes to no text goes out, and the text after it does not wait a window."""
    queue: DeltaInbox = DeltaInbox()
    stream = open_stream(queue, 0.5)
    try:
        queue.put_nowait(d(""))
        assert (await asyncio.wait_for(anext(stream), 5)).text == ""
        queue.put_nowait(d("first words", n=2))
        start = time.monotonic()
        assert (await asyncio.wait_for(anext(stream), 5)).text == "first words"
        assert time.monotonic() - start < 0.25
        queue.put_nowait(d("more", n=3))  # a window has started now: this one waits for its end
        start = time.monotonic()
        assert (await asyncio.wait_for(anext(stream), 5)).text == "more"
        assert time.monotonic() - start > 0.3
    finally:
        await stream.aclose()


async def test_delta_after_quiet_spell_is_not_delayed() -> None:
    queue: DeltaInbox = DeltaInbox()
    stream = open_stream(queue, 0.5)
    try:
        queue.put_nowait(d("a"))
        assert (await asyncio.wait_for(anext(stream), 5)).text == "a"
        await asyncio.sleep(0.7)  # longer than the window
        queue.put_nowait(d("b"))
        start = time.monotonic()
        second = await asyncio.wait_for(anext(stream), 5)
        assert time.monotonic() - start < 0.25
        assert second.text == "b"
    finally:
        await stream.aclose()


async def test_deltas_queued_together_come_out_as_one() -> None:
    queue: DeltaInbox = DeltaInbox()
    for i, text in enumerate(["a", "b", "c"], start=1):
        queue.put_nowait(d(text, i))
    stream = open_stream(queue, 0.5)
    try:
        start = time.monotonic()
        merged = await asyncio.wait_for(anext(stream), 5)
        assert time.monotonic() - start < 0.25
        assert merged.text == "abc"
        assert merged.completion_tokens == 3
    finally:
        await stream.aclose()


async def test_fast_deltas_are_grouped_and_ordered() -> None:
    queue: DeltaInbox = DeltaInbox()
    count = 60
    texts = [f"t{i} " for i in range(count)]

    async def produce() -> None:
        for i, text in enumerate(texts):
            queue.put_nowait(d(text, i + 1))
            await asyncio.sleep(0.01)
        queue.put_nowait(d("end", count + 1, "stop"))

    producer = asyncio.create_task(produce())
    chunks = [chunk async for chunk in open_stream(queue, 0.2)]
    await producer
    # At least 0.6 s of deltas in 0.2 s windows: a handful of chunks, far fewer than the deltas.
    assert 2 <= len(chunks) <= count // 4
    assert chunks[0].text == "t0 "  # the first delta never waits
    assert "".join(c.text for c in chunks) == "".join(texts) + "end"
    assert chunks[-1].finish_reason == "stop"
    assert chunks[-1].completion_tokens == count + 1
    assert all(c.finish_reason is None for c in chunks[:-1])
    counts = [c.completion_tokens for c in chunks]
    assert counts == sorted(counts)


async def test_slow_deltas_come_out_alone() -> None:
    queue: DeltaInbox = DeltaInbox()
    texts = ["a", "b", "c"]

    async def produce() -> None:
        for i, text in enumerate(texts):
            queue.put_nowait(d(text, i + 1))
            await asyncio.sleep(0.2)
        queue.put_nowait(d("z", 4, "stop"))

    producer = asyncio.create_task(produce())
    chunks = [chunk async for chunk in open_stream(queue, 0.05)]
    await producer
    assert [c.text for c in chunks] == ["a", "b", "c", "z"]
    assert [c.finish_reason for c in chunks] == [None, None, None, "stop"]


async def test_finish_ends_stream_without_waiting_for_window() -> None:
    queue: DeltaInbox = DeltaInbox()
    stream = open_stream(queue, 0.5)
    queue.put_nowait(d("a", 1))
    assert (await asyncio.wait_for(anext(stream), 5)).text == "a"
    # The next delta falls inside the window, so it waits for more...
    queue.put_nowait(d("b", 2))
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)
    assert not pending.done()
    # ...until the finish arrives, which goes out at once with it.
    queue.put_nowait(d("c", 3, "stop"))
    start = time.monotonic()
    last = await asyncio.wait_for(pending, 5)
    assert time.monotonic() - start < 0.25
    assert last.text == "bc"
    assert last.finish_reason == "stop"
    assert last.completion_tokens == 3
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_finish_stops_draining() -> None:
    queue: DeltaInbox = DeltaInbox()
    queue.put_nowait(d("a", 1, "stop"))
    queue.put_nowait(d("after", 2))
    chunks = [c async for c in open_stream(queue, 0.1)]
    assert [c.text for c in chunks] == ["a"]
    assert queue.qsize() == 1


async def test_first_delta_with_finish() -> None:
    queue: DeltaInbox = DeltaInbox()
    queue.put_nowait(d("", 0, "abort"))
    chunks = [c async for c in open_stream(queue, 0.5)]
    assert len(chunks) == 1
    assert chunks[0].finish_reason == "abort"


async def test_queued_exception_is_raised() -> None:
    queue: DeltaInbox = DeltaInbox()
    stream = open_stream(queue, 0.05)
    queue.put_nowait(d("a"))
    assert (await asyncio.wait_for(anext(stream), 5)).text == "a"
    queue.put_nowait(RuntimeError("engine died"))
    with pytest.raises(RuntimeError, match="engine died"):
        await asyncio.wait_for(anext(stream), 5)


async def test_exception_first_is_raised() -> None:
    queue: DeltaInbox = DeltaInbox()
    queue.put_nowait(ValueError("bad request"))
    with pytest.raises(ValueError, match="bad request"):
        async for _ in open_stream(queue, 0.05):
            pass


async def test_exception_while_waiting_in_window_is_raised() -> None:
    queue: DeltaInbox = DeltaInbox()
    stream = open_stream(queue, 0.5)
    queue.put_nowait(d("a"))
    await asyncio.wait_for(anext(stream), 5)
    queue.put_nowait(d("b"))
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)
    queue.put_nowait(RuntimeError("mid-window"))
    with pytest.raises(RuntimeError, match="mid-window"):
        await asyncio.wait_for(pending, 5)


def test_the_window_widens_with_the_number_of_streams_within_its_bounds() -> None:
    from workers.triton.generator.model import CoalescingPolicy

    policy = CoalescingPolicy(min_window_s=0.005, max_window_s=0.1, max_chunks_per_s=400)
    assert policy.window_s(1) == 0.005  # a lone stream is never held back longer than the minimum
    assert policy.window_s(8) == pytest.approx(0.02)  # 8 streams x 50 chunks/s = 400 chunks/s
    assert policy.window_s(32) == pytest.approx(0.08)
    assert policy.window_s(1000) == 0.1  # never longer than the maximum
    assert policy.window_s(0) == 0.005


async def test_within_a_window_only_the_last_delta_or_an_error_wakes_the_coalescer() -> None:
    loop = asyncio.get_running_loop()
    inbox = DeltaInbox()
    waiting = asyncio.ensure_future(inbox.take_by(loop.time() + 10))
    await asyncio.sleep(0)
    for i in range(20):  # tokens within the window: appended, nobody woken
        inbox.put_nowait(d(f"t{i} ", i + 1))
        await asyncio.sleep(0.001)
    assert not waiting.done()
    inbox.put_nowait(d("end", 21, "stop"))
    taken = await asyncio.wait_for(waiting, 1)
    assert "".join(delta.text for delta in taken) == "".join(f"t{i} " for i in range(20)) + "end"

    errored = asyncio.ensure_future(inbox.take_by(loop.time() + 10))
    await asyncio.sleep(0)
    inbox.put_nowait(RuntimeError("engine died"))
    with pytest.raises(RuntimeError, match="engine died"):
        await asyncio.wait_for(errored, 1)


async def test_a_window_ends_on_time_without_any_delta() -> None:
    loop = asyncio.get_running_loop()
    inbox = DeltaInbox()
    started = loop.time()
    assert await inbox.take_by(started + 0.05) == []
    assert 0.04 <= loop.time() - started < 0.5
