"""One LoRA adapter on one worker: loaded onto its base's warm engine, never an engine of its own.

An adapter is a model of its own everywhere else (its job stream, replica leases, keep-alive, keys,
metrics); here its load is the fetch of its files (through the node cache, as any model's) and one
call into the base's engine, and its unload the reverse. Its jobs run on the base's Triton model,
which looks the adapter up by the job's model name. A job holds the base as well as the adapter, so
the base is busy while any of its adapters is; a base that leaves unloads its adapters first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from switchboard.config import ModelConfig
from switchboard.wire import ModelLimits
from workers.engines.base import Adapter
from workers.models.slot import Lease, LoadFailed, ModelSlot, ServedModel, SlotNotServing
from workers.triton.generator.model import GeneratorModel

logger = logging.getLogger(__name__)


class AdapterSlot(ModelSlot):
    """A LoRA adapter of `base`, known to the base's engine here as `adapter_id`."""

    def __init__(self, model: ModelConfig, *, base: ModelSlot, adapter_id: int, **slot_args: Any) -> None:
        """`slot_args`: as a ModelSlot's (the worker's Triton host, its callbacks, its files)."""
        super().__init__(model, **slot_args)
        self.base = base
        self.adapter_id = adapter_id
        base.adapters.append(self)

    @property
    def wants_jobs(self) -> bool:
        """While warm and its base can run its jobs."""
        return self.state == "warm" and self.base.wants_jobs

    def engine_ended(self) -> str | None:
        """Its base's engine ended, or its base left under it."""
        if self.state != "warm":
            return None
        if self.base.state != "warm":
            return f"its base {self.base.name} is no longer warm here"
        return self.base.engine_ended()

    def lease(self, *, also: Lease | None = None, batch: bool = False) -> Lease:
        """Hold the adapter and its base for one job."""
        base_lease = self.base.lease(also=also, batch=batch)
        try:
            return super().lease(also=base_lease, batch=batch)
        except SlotNotServing:
            base_lease.release()
            raise

    def limits(self) -> ModelLimits | None:
        """Its base's: the adapter runs on the base's tokenizer and context."""
        return self.base.limits()

    def memory_bytes(self) -> int:
        """Nothing of its own: it lives in its base's engine, whose footprint counts it."""
        return 0

    async def sleep(self) -> None:
        """Adapters do not sleep: one that is idle leaves (reloading it takes milliseconds)."""

    async def _load(self) -> None:
        self.load_started = time.time()
        self.warmed_from = "cold"
        self._set_state("loading")
        try:
            served = self.base.serving()
            if served is None or not isinstance(served.triton_model, GeneratorModel):
                raise LoadFailed(f"its base {self.base.name} is not warm here")
            files = await self._hold_files()
            adapter = Adapter(name=self.name, id=self.adapter_id, path=files.model.path)
            try:
                await asyncio.wrap_future(served.triton_model.load_adapter(adapter))
            except BaseException:
                files.release()
                raise
        except BaseException:
            self._set_state("cold")
            raise
        self._files = files
        self._served = ServedModel(name=self.name, client=served.client, triton_model=served.triton_model)
        self._became_warm()

    async def _release(self) -> None:
        served, files = self._served, self._files
        self._served = None
        self._files = None
        try:
            if isinstance(served, ServedModel) and isinstance(served.triton_model, GeneratorModel):
                await asyncio.wrap_future(served.triton_model.unload_adapter(self.name))
        except Exception:
            # The base's engine is gone (it ended, or is being stopped): so is the adapter in it.
            logger.warning(
                "could not unload an adapter from its engine", exc_info=True, extra={"model": self.name}
            )
        finally:
            if files is not None:
                files.release()
