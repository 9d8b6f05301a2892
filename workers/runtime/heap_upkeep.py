"""When the worker freezes a warm model's objects and collects an unloaded one's: between jobs.

A collection stops the whole process, and with it every stream of every model the worker serves.
Freezing what a model's load made walks those objects (210,000 for the first vLLM model), and
collecting once a model is unloaded walks the whole heap (340 ms measured). Run the moment a
model's state changed, that stalled the jobs of the other models held here. So the upkeep waits for
a moment with no job running, for `MAX_DEFER_S` at most: a worker busy without a pause still gets
the unloaded model's memory back (`switchboard.gc_heap`).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Literal

from switchboard import gc_heap
from workers.models.slot import ModelSlot
from workers.models.slots import Slots

# Longest a freeze or a collection waits for the worker to have no job running.
MAX_DEFER_S = 30.0

Upkeep = Literal["freeze", "collect"]


class HeapUpkeep:
    """Freezes or collects the heap after a model's state changed, once no job runs."""

    def __init__(self, slots: Slots, *, max_defer_s: float = MAX_DEFER_S) -> None:
        self._slots = slots
        self._max_defer_s = max_defer_s
        self._due: Upkeep | None = None
        self._wanted = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        slots.on_state_changed(self.model_changed)
        slots.on_jobs_changed(self._jobs_changed)

    def model_changed(self, slot: ModelSlot) -> None:
        """A model that became warm is frozen, one that became cold collected. A collection freezes
        what survives as well, so it stands for a freeze due before it. An adapter's load or unload
        makes or frees nearly nothing in this process (it lives in its base's engine): it is left
        alone, since the freeze's walk of the heap (70 ms) ran first thing once it was warm, before
        the job that asked for it was taken, and was most of a cold adapter's first token."""
        if slot.model.adapter:
            return
        if slot.state == "cold":
            self._due = "collect"
        elif slot.state == "warm" and self._due is None:
            self._due = "freeze"
        else:
            return
        self._wanted.set()

    async def run(self) -> None:
        """Do each upkeep as it falls due, once no job runs; until cancelled."""
        while True:
            await self._wanted.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), self._max_defer_s)
            due, self._due = self._due, None
            self._wanted.clear()
            if due == "collect":
                gc_heap.collect_all()
            elif due == "freeze":
                gc_heap.freeze_new()

    def _jobs_changed(self) -> None:
        if any(slot.in_flight for slot in self._slots.held()):
            self._idle.clear()
        else:
            self._idle.set()
