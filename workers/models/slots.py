"""The model slots of one worker, as the consumer and the controller share them.

The consumer reads the job streams of the warm slots and waits for a change when none is warm;
a slot leaving warm waits for the consumer's read in progress (the read barrier) before it stops
taking jobs. Both sides meet here, so neither reaches into the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from switchboard.config import ModelConfig
from workers.engines.base import Engine
from workers.models.adapter_slot import AdapterSlot
from workers.models.files import ModelFiles
from workers.models.slot import ModelSlot
from workers.runtime.cpu_priority import ModelLoad
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
        files: ModelFiles | None = None,
    ) -> None:
        self.changed = asyncio.Event()
        self._read_done: asyncio.Event | None = None
        self._slot_args: dict[str, Any] = {
            "host": host,
            "host_started": host_started,
            "create_engine": create_engine,
            "read_barrier": self.read_barrier,
            "on_jobs": self._jobs_changed,
            "files": files,
        }
        self._slots: dict[str, ModelSlot] = {}
        # The slots that are not cold, kept as they change: a pass, a heartbeat and the consumer
        # look at these few, not at every model configured.
        self._position = {model.name: position for position, model in enumerate(models)}
        self._held: set[str] = set()
        # The engines' numbers for adapters: unique on this worker, never reused.
        self._adapter_ids = itertools.count(1)
        # Bases first: an adapter's slot is made beside its base's.
        for model in sorted(models, key=lambda model: model.base is not None):
            self.add(model)
        self._job_listeners: list[Callable[[], None]] = []
        self._state_listeners: list[Callable[[ModelSlot], None]] = []

    def add(self, model: ModelConfig) -> ModelSlot | None:
        """A slot for `model` (None for an adapter whose base this worker does not hold)."""
        on_change = functools.partial(self._slot_changed, model.name)
        if model.base is None:
            slot = ModelSlot(model, on_change=on_change, **self._slot_args)
        elif model.base in self._slots:
            base = self._slots[model.base]
            slot = AdapterSlot(
                model, base=base, adapter_id=next(self._adapter_ids), on_change=on_change, **self._slot_args
            )
        else:
            return None
        self._slots[model.name] = slot
        self._position.setdefault(model.name, len(self._position))
        return slot

    def remove(self, name: str) -> None:
        """Forget the cold slot `name` (an adapter whose registration was removed)."""
        slot = self._slots[name]
        if slot.state != "cold":
            raise RuntimeError(f"{name} is {slot.state} here; unload it before removing its slot")
        if isinstance(slot, AdapterSlot):
            slot.base.adapters.remove(slot)
        del self._slots[name]
        self._position.pop(name, None)
        self._held.discard(name)

    def __getitem__(self, name: str) -> ModelSlot:
        return self._slots[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)

    def held(self) -> list[ModelSlot]:
        """The slots that are not cold (loading, warm, asleep, unloading), in configuration order."""
        return [self._slots[name] for name in sorted(self._held, key=self._position.__getitem__)]

    def held_names(self) -> set[str]:
        """The names of the slots that are not cold."""
        return set(self._held)

    def warm(self) -> list[ModelSlot]:
        """The slots whose job streams the consumer reads now (the event `changed` is set when
        this may have changed; the reader clears it before it looks)."""
        return [slot for slot in self.held() if slot.wants_jobs]

    def model_loads(self) -> list[ModelLoad]:
        """The jobs each held model runs here now, with its weight and priority."""
        return [
            ModelLoad(slot.name, slot.in_flight, slot.model.weight, slot.model.priority)
            for slot in self.held()
        ]

    def engine_processes(self, name: str) -> list[int]:
        """The processes of the model's engine while held (none for an engine in this process)."""
        engine = self._slots[name].engine
        return engine.process_ids() if engine is not None else []

    def on_jobs_changed(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener` after any model's job starts or ends; returns what stops that."""
        self._job_listeners.append(listener)
        return functools.partial(self._job_listeners.remove, listener)

    def on_state_changed(self, listener: Callable[[ModelSlot], None]) -> Callable[[], None]:
        """Call `listener` with a slot whose state has just changed; returns what stops that."""
        self._state_listeners.append(listener)
        return functools.partial(self._state_listeners.remove, listener)

    def _jobs_changed(self) -> None:
        for listener in self._job_listeners:
            listener()

    def _slot_changed(self, name: str) -> None:
        if self._slots[name].state == "cold":
            self._held.discard(name)
        else:
            self._held.add(name)
        self.changed.set()
        for listener in self._state_listeners:
            listener(self._slots[name])

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
