"""What the model controller does outside itself, behind one surface: leases, records, slot transitions.

The loop (`loop.py`) decides when; `ControllerEffects` is everything it touches to carry that out:
the demand stream, the snapshot, replica leases, the cost and failure records, the model slots and
the consumer's waiting jobs. `WorkerEffects` is the real one (Redis, the slots, the consumer); the
tests drive the loop with a recording fake.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, cast

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from switchboard import keys
from switchboard.config import ModelConfig
from switchboard.demand import poke_demand
from switchboard.redis_conn import stream_entries
from switchboard.wire import JobError
from workers.controller.coordination import Coordination
from workers.controller.snapshot import LocalFacts, SnapshotReader
from workers.controller.view import View
from workers.jobs.consume import JobConsumer
from workers.models.adapter_slot import AdapterSlot
from workers.models.files import ModelFiles
from workers.models.slots import Slots

logger = logging.getLogger(__name__)

# A poke's field as redis-py reads it: the model it is about.
_MODEL = keys.MODEL_FIELD.encode()


class ControllerEffects(Protocol):
    """Every side effect of the controller loop; the slot transitions raise `LoadFailed` as the slots do."""

    # --- when to decide, and on what ---

    async def follow_demand(self) -> None:
        """Start following the demand stream from its current end."""

    async def wait_for_demand(self, timeout_ms: int) -> list[str]:
        """The models named by the pokes of the demand stream ("" for any), or [] after `timeout_ms`."""

    def may_hold(self, model: str) -> bool:
        """Whether this worker could ever hold `model` (a poke about any other is not for it)."""

    def loads_at_once(self, model: str) -> bool:
        """Whether `model` is an adapter cold here whose base is warm here: its load takes
        milliseconds, so a poke about it is not left to settle."""

    async def poke(self) -> None:
        """Wake every worker's controller: something changed that may call for a decision."""

    async def advertise(self) -> None:
        """Publish this worker's record (its slots) now."""

    async def read_view(self, local: LocalFacts) -> View:
        """One snapshot of demand, holders and costs for a decision."""

    def is_cold(self, model: str) -> bool:
        """Whether the model's slot here is cold."""

    def engines_ended(self) -> dict[str, str]:
        """The warm models here whose engine can no longer generate, and why."""

    async def serving_elsewhere(self, model: str) -> bool:
        """Whether another live worker serves the model warm."""

    # --- replica leases (the slot keeps the replica it holds) ---

    async def take_lease(self, model: str, replica: int) -> bool:
        """Claim the replica for this worker's slot; False if someone else holds it."""

    async def renew_leases(self) -> list[tuple[str, int]]:
        """Extend every lease the slots hold; returns the (model, replica) lost for good, now dropped."""

    async def release_lease(self, model: str) -> None:
        """Give up the replica the model's slot holds, if any."""

    # --- records every worker and front door reads ---

    async def record_cost(self, model: str, operation: str, value: float) -> None:
        """Keep one measurement of `operation` on this worker kind."""

    async def record_failure(
        self, model: str, reason: str, backoff_s: float, in_a_row: int, detail: str = ""
    ) -> None:
        """Tell everyone the model failed to load, until it may be retried (`detail`: for operators)."""

    async def clear_failure(self, model: str) -> None:
        """Forget the model's load failures."""

    async def publish_limits(self, model: str) -> None:
        """Publish what the loaded model accepts (when its engine says)."""

    async def consume_load_request(self, model: str) -> None:
        """An operator's load request was carried out."""

    async def refuse_waiting(self, model: str, error: JobError) -> int:
        """Answer the model's waiting jobs with `error`; returns how many."""

    # --- slot transitions ---

    async def load(self, model: str, expected_s: float | None) -> None:
        """Bring the cold model to warm (it should take about `expected_s`)."""

    async def wake(self, model: str, expected_s: float | None) -> None:
        """Bring the sleeping model back to warm."""

    async def sleep(self, model: str) -> None:
        """Put the warm model to sleep."""

    async def unload(self, model: str) -> None:
        """Unload the model (its lease is released apart)."""

    def memory_bytes(self, model: str) -> int:
        """What the model takes here now."""

    def fetched(self, model: str) -> tuple[float, int]:
        """Of the model's last load here: the seconds spent on its files, and their bytes (0 for a
        local folder)."""

    async def prefetch(self, model: str) -> None:
        """Fetch the remote model's files into the node cache without loading it (raises FetchFailed)."""

    # --- adapters registered and removed at run time ---

    def add_model(self, model: ModelConfig) -> bool:
        """Give `model` a slot here and weigh it from the next pass; False when this worker cannot
        hold it (an adapter of a base it does not hold)."""

    def stop_weighing(self, model: str) -> None:
        """Leave `model` out of every pass from now on (its slot stays until `forget`)."""

    def has_slot(self, model: str) -> bool:
        """Whether `model` has a slot here."""

    async def forget(self, model: str) -> None:
        """Drop the cold slot of a removed model, answering its waiting jobs that it is gone."""


class WorkerEffects:
    """The controller's effects on one worker: Redis through `Coordination`, the slots, the consumer."""

    def __init__(
        self,
        *,
        redis: aioredis.Redis,
        poke_redis: aioredis.Redis,
        slots: Slots,
        consumer: JobConsumer,
        coordination: Coordination,
        snapshot: SnapshotReader,
        worker_id: str,
        advertise: Callable[[], Awaitable[None]],
        files: ModelFiles | None = None,
    ) -> None:
        self._redis = redis
        self._files = files
        self._poke_redis = poke_redis
        self._slots = slots
        # Models whose lease this controller took (their slot may still be cold, its load not begun).
        self._leased: set[str] = set()
        self._consumer = consumer
        self._coordination = coordination
        self._snapshot = snapshot
        self._worker_id = worker_id
        self._advertise = advertise
        self._demand_last_id: bytes = b"0-0"

    async def follow_demand(self) -> None:
        """Start following the demand stream from its current end."""
        newest = await self._redis.xrevrange(keys.demand_stream(), count=1)
        if newest:
            self._demand_last_id = cast(bytes, newest[0][0])

    async def wait_for_demand(self, timeout_ms: int) -> list[str]:
        """The models named by the pokes of the demand stream ("" for any), or [] after `timeout_ms`."""
        try:
            response = await self._poke_redis.xread(
                {keys.demand_stream(): self._demand_last_id}, block=timeout_ms
            )
        except (ConnectionError, OSError, aioredis.RedisError):
            logger.warning("waiting for demand failed; retrying", exc_info=True)
            await asyncio.sleep(timeout_ms / 1000)
            return []
        named: list[str] = []
        for _, entries in stream_entries(response):
            self._demand_last_id = entries[-1][0]
            named += [fields.get(_MODEL, b"").decode() for _, fields in entries]
        return named

    def may_hold(self, model: str) -> bool:
        """Whether this worker could ever hold `model` (a poke about any other is not for it)."""
        return self._snapshot.may_hold(model)

    def loads_at_once(self, model: str) -> bool:
        """Whether `model` is an adapter cold here whose base is warm here."""
        slot = self._slots.get(model)
        return isinstance(slot, AdapterSlot) and slot.state == "cold" and slot.base.state == "warm"

    async def poke(self) -> None:
        """Wake every worker's controller: something changed that may call for a decision."""
        pipe = self._redis.pipeline(transaction=False)
        poke_demand(pipe)
        await pipe.execute()

    async def advertise(self) -> None:
        """Publish this worker's record (its slots) now."""
        await self._advertise()

    async def read_view(self, local: LocalFacts) -> View:
        """One snapshot of demand, holders and costs for a decision."""
        return await self._snapshot.read(local)

    def is_cold(self, model: str) -> bool:
        """Whether the model's slot here is cold."""
        return self._slots[model].state == "cold"

    def engines_ended(self) -> dict[str, str]:
        """The warm models here whose engine can no longer generate, and why."""
        ended = {slot.name: slot.engine_ended() for slot in self._slots.held()}
        return {name: why for name, why in ended.items() if why is not None}

    async def serving_elsewhere(self, model: str) -> bool:
        """Whether another live worker serves the model warm."""
        holders = await self._snapshot.holders_elsewhere(model, self._worker_id)
        return any(status.state == "warm" for status in holders)

    async def take_lease(self, model: str, replica: int) -> bool:
        """Claim the replica for this worker's slot; False if someone else holds it."""
        if not await self._coordination.take_lease(model, replica):
            return False
        self._slots[model].replica = replica
        self._leased.add(model)
        return True

    async def renew_leases(self) -> list[tuple[str, int]]:
        """Extend every lease the slots hold; returns the (model, replica) lost for good, now dropped."""
        # A lease is taken before its load starts: the slots leased since are looked at too.
        self._leased = {name for name in self._leased if self._slots[name].replica is not None}
        leased = self._leased | self._slots.held_names()
        held = [
            (name, replica) for name in sorted(leased) if (replica := self._slots[name].replica) is not None
        ]
        lost_for_good = []
        for model, replica in await self._coordination.renew_leases(held):
            slot = self._slots.get(model)
            if slot is None or slot.replica != replica:
                continue  # given up while the renewal ran: released, not lost
            if not await self._coordination.take_lease(model, replica):
                slot.replica = None
                lost_for_good.append((model, replica))
        return lost_for_good

    async def release_lease(self, model: str) -> None:
        """Give up the replica the model's slot holds, if any."""
        await self._coordination.release_slot_lease(self._slots[model])

    async def record_cost(self, model: str, operation: str, value: float) -> None:
        """Keep one measurement of `operation` on this worker kind."""
        await self._coordination.record_cost(model, operation, value)

    async def record_failure(
        self, model: str, reason: str, backoff_s: float, in_a_row: int, detail: str = ""
    ) -> None:
        """Tell everyone the model failed to load, until it may be retried (`detail`: for operators)."""
        await self._coordination.record_failure(model, reason, backoff_s, in_a_row, detail)

    async def clear_failure(self, model: str) -> None:
        """Forget the model's load failures."""
        await self._coordination.clear_failure(model)

    async def publish_limits(self, model: str) -> None:
        """Publish what the loaded model accepts (when its engine says)."""
        limits = self._slots[model].limits()
        if limits is not None:
            await self._coordination.publish_limits(model, limits)

    async def consume_load_request(self, model: str) -> None:
        """An operator's load request was carried out."""
        await self._coordination.consume_load_request(model)

    async def refuse_waiting(self, model: str, error: JobError) -> int:
        """Answer the model's waiting jobs with `error`; returns how many."""
        return await self._consumer.refuse_waiting(model, error)

    async def load(self, model: str, expected_s: float | None) -> None:
        """Bring the cold model to warm (it should take about `expected_s`)."""
        await self._ensure_warm(model, expected_s)

    async def wake(self, model: str, expected_s: float | None) -> None:
        """Bring the sleeping model back to warm."""
        await self._ensure_warm(model, expected_s)

    async def sleep(self, model: str) -> None:
        """Put the warm model to sleep (a base's adapters leave first, their leases with them)."""
        await self._slots[model].sleep()
        await self._release_adapters_gone(model)

    async def unload(self, model: str) -> None:
        """Unload the model (its lease is released apart; a base's adapters leave first, their
        leases with them)."""
        await self._slots[model].unload()
        await self._release_adapters_gone(model)

    async def _release_adapters_gone(self, base: str) -> None:
        """The replica leases of the base's adapters that left with it: held on, they would count
        as replicas that serve, and the adapters' next requests would wait for them forever."""
        for adapter in self._slots[base].adapters:
            if adapter.state == "cold" and adapter.replica is not None:
                logger.info(f"{adapter.name} unloaded with its base {base}", extra={"model": adapter.name})
                await self._coordination.release_slot_lease(adapter)

    def memory_bytes(self, model: str) -> int:
        """What the model takes here now."""
        return self._slots[model].memory_bytes()

    def fetched(self, model: str) -> tuple[float, int]:
        """Of the model's last load here: the seconds spent on its files, and their bytes (0 for a
        local folder)."""
        files = self._slots[model].last_files
        return (files.fetch_s, files.total_bytes) if files is not None else (0.0, 0)

    async def prefetch(self, model: str) -> None:
        """Fetch the remote model's files into the node cache without loading it (raises FetchFailed)."""
        if self._files is not None:
            await self._files.prefetch(self._slots[model].model)

    def add_model(self, model: ModelConfig) -> bool:
        """Give `model` a slot here and weigh it from the next pass; False when this worker cannot
        hold it (an adapter of a base it does not hold)."""
        if self._slots.add(model) is None:
            return False
        if self._files is not None:
            self._files.add(model)
        self._snapshot.add(model)
        return True

    def stop_weighing(self, model: str) -> None:
        """Leave `model` out of every pass from now on (its slot stays until `forget`)."""
        self._snapshot.remove(model)

    def has_slot(self, model: str) -> bool:
        """Whether `model` has a slot here."""
        return model in self._slots

    async def forget(self, model: str) -> None:
        """Drop the cold slot of a removed model, answering its waiting jobs that it is gone (those
        no worker has taken: each is answered once, by whichever worker reads it)."""
        gone = JobError(
            code="invalid_request",
            message=f"The model `{model}` was removed while this request waited.",
            param="model",
            client_code="model_not_found",
        )
        try:
            refused = await self._consumer.refuse_waiting(model, gone)
        except ResponseError:
            refused = 0  # no job ever came for it: its stream has no group
        if refused:
            logger.info(f"answered {refused} waiting jobs of {model}: removed", extra={"model": model})
        self._leased.discard(model)
        self._slots.remove(model)
        if self._files is not None:
            self._files.remove(model)

    async def _ensure_warm(self, model: str, expected_s: float | None) -> None:
        slot = self._slots[model]
        slot.expected_load_s = expected_s
        await slot.ensure_warm()
