"""One poll helper and one task set for every background loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from switchboard.tasks import TaskSet, poll


async def test_a_failing_step_is_logged_and_tried_again(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0
    again = asyncio.Event()

    async def step() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        again.set()

    tasks = TaskSet("test")
    with caplog.at_level(logging.WARNING):
        tasks.start(poll(step, 0.01, "step", first_wait=False), "poller")
        await asyncio.wait_for(again.wait(), timeout=5)
    await tasks.stop()
    assert calls >= 2
    assert "could not step" in caplog.text


async def test_stop_cancels_and_awaits_every_task_and_is_idempotent() -> None:
    unwound: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            unwound.append(name)

    tasks = TaskSet("test")
    started = [tasks.start(forever(name), name) for name in ("a", "b")]
    await asyncio.sleep(0)
    assert len(tasks) == 2
    assert started[0].get_name() == "test: a"
    await tasks.stop()
    assert sorted(unwound) == ["a", "b"] and len(tasks) == 0
    await tasks.stop()


async def test_stop_ends_a_task_that_missed_its_first_cancellation() -> None:
    # As Python 3.11's asyncio.wait_for does when its operation finishes as it is cancelled.
    missed = 0

    async def loop_that_loses_one_cancellation() -> None:
        nonlocal missed
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if missed:
                    raise
                missed += 1

    tasks = TaskSet("test")
    task = tasks.start(loop_that_loses_one_cancellation(), "loop")
    await asyncio.sleep(0.02)
    await asyncio.wait_for(tasks.stop(), timeout=5)
    assert missed == 1 and task.cancelled() and len(tasks) == 0


async def test_a_stop_that_is_itself_cancelled_says_so() -> None:
    stubborn_for = asyncio.Event()
    stubborn_for.set()

    async def stubborn() -> None:
        while stubborn_for.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.05)

    tasks = TaskSet("test")
    task = tasks.start(stubborn(), "stubborn")
    await asyncio.sleep(0)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await tasks.stop()
    assert not task.done()
    stubborn_for.clear()
    await asyncio.wait_for(task, timeout=5)
