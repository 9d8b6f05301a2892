"""The heap upkeep alone: a freeze or a collection waits for no job to run, at most its bound; a
collection stands for a freeze due before it. (The worker's own use: tests/workers/test_main.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from switchboard import gc_heap
from tests.support.one_worker import until
from workers.runtime.heap_upkeep import HeapUpkeep


@dataclass
class FakeModel:
    adapter: bool = False


@dataclass
class FakeSlot:
    state: str = "cold"
    in_flight: int = 0
    model: FakeModel = field(default_factory=FakeModel)


@dataclass
class FakeSlots:
    """The two notifications and the held slots that the upkeep reads of `workers.models.slots.Slots`."""

    slots: list[FakeSlot] = field(default_factory=lambda: [FakeSlot()])
    state_listeners: list[Callable[[Any], None]] = field(default_factory=list)
    job_listeners: list[Callable[[], None]] = field(default_factory=list)

    def on_state_changed(self, listener: Callable[[Any], None]) -> None:
        self.state_listeners.append(listener)

    def on_jobs_changed(self, listener: Callable[[], None]) -> None:
        self.job_listeners.append(listener)

    def held(self) -> list[FakeSlot]:
        return self.slots

    def change(self, slot: FakeSlot, *, state: str | None = None, in_flight: int | None = None) -> None:
        if in_flight is not None:
            slot.in_flight = in_flight
            for listener in self.job_listeners:
                listener()
        if state is not None:
            slot.state = state
            for listener in self.state_listeners:
                listener(slot)


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    done: list[str] = []
    monkeypatch.setattr(gc_heap, "freeze_new", lambda: done.append("freeze"))
    monkeypatch.setattr(gc_heap, "collect_all", lambda: done.append("collect"))
    return done


async def test_a_busy_worker_still_collects_once_the_bound_has_passed(asked: list[str]) -> None:
    slots = FakeSlots()
    upkeep = HeapUpkeep(slots, max_defer_s=0.3)  # type: ignore[arg-type]
    running = asyncio.create_task(upkeep.run())
    try:
        slots.change(slots.slots[0], in_flight=1)  # a job that never ends
        started = asyncio.get_running_loop().time()
        slots.change(slots.slots[0], state="cold")
        await until(lambda: bool(asked), 5, "the collection")
        assert asked == ["collect"]
        assert asyncio.get_running_loop().time() - started >= 0.3
    finally:
        running.cancel()


async def test_a_collection_stands_for_the_freeze_due_before_it(asked: list[str]) -> None:
    slots = FakeSlots()
    upkeep = HeapUpkeep(slots, max_defer_s=5.0)  # type: ignore[arg-type]
    running = asyncio.create_task(upkeep.run())
    try:
        slots.change(slots.slots[0], in_flight=1)
        slots.change(slots.slots[0], state="warm")
        slots.change(slots.slots[0], state="cold")
        await asyncio.sleep(0.1)
        assert asked == [], "nothing while the job runs"
        slots.change(slots.slots[0], in_flight=0)
        await until(lambda: bool(asked), 5, "the collection")
        await asyncio.sleep(0.1)
        assert asked == ["collect"]
    finally:
        running.cancel()


async def test_an_adapter_coming_and_going_walks_no_heap(asked: list[str]) -> None:
    adapter = FakeSlot(model=FakeModel(adapter=True))
    slots = FakeSlots(slots=[adapter])
    upkeep = HeapUpkeep(slots, max_defer_s=5.0)  # type: ignore[arg-type]
    running = asyncio.create_task(upkeep.run())
    try:
        slots.change(adapter, state="warm")  # its first job waits to be taken: no stall before it
        slots.change(adapter, state="cold")
        await asyncio.sleep(0.1)
        assert asked == []
    finally:
        running.cancel()
