"""The model slots of one worker, as the consumer and the controller share them.

The consumer reads the job streams of the warm slots and waits for a change when none is warm;
a slot leaving warm waits for the consumer's read in progress (the read barrier) before it stops
taking jobs. Both sides meet here, so neither reaches into the other.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Mapping

from switchboard.config import ModelConfig
from workers.engines.base import Engine
from workers.models.slot import ModelSlot
from workers.triton.host import TritonHost


class Slots(Mapping[str, ModelSlot]):
    """Every model this worker may hold, by name; the warm set and its change event."""

    def __init__(
        self,
        models: list[ModelConfig],
        *,
        host: TritonHost,
        host_started: asyncio.Event,
        create_engine: Callable[[ModelConfig], Engine],
    ) -> None:
        self.changed = asyncio.Event()
        self._read_done: asyncio.Event | None = None
        self._slots = {
            model.name: ModelSlot(
                model,
                host=host,
                host_started=host_started,
                create_engine=create_engine,
                read_barrier=self.read_barrier,
                on_change=self.changed.set,
            )
            for model in models
        }

    def __getitem__(self, name: str) -> ModelSlot:
        return self._slots[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)

    def warm(self) -> list[ModelSlot]:
        """The slots whose job streams the consumer reads now (the event `changed` is set when
        this may have changed; the reader clears it before it looks)."""
        return [slot for slot in self._slots.values() if slot.wants_jobs]

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Mark a read of the warm slots' streams in progress (see `read_barrier`)."""
        self._read_done = done = asyncio.Event()
        try:
            yield
        finally:
            done.set()
            self._read_done = None

    async def read_barrier(self) -> None:
        """Return once the read in progress (if any) is over and its jobs hold their leases."""
        if self._read_done is not None:
            await self._read_done.wait()
