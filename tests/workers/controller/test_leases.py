"""Replica leases against a real Redis: a lease given up while a renewal of it is under way stays
given up (the renewal used to find it gone and take it again, for a slot that no longer held it:
the model's next load waited until that lease expired)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard import keys
from workers.controller.coordination import Coordination
from workers.controller.effects import WorkerEffects


class HeldSlots(dict[str, Any]):
    """The two things `renew_leases` asks of the worker's slots."""

    def held_names(self) -> set[str]:
        return set(self)


async def test_a_lease_released_during_its_renewal_is_not_taken_again(
    redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordination = Coordination(redis, "w1", "cpu")
    slot = SimpleNamespace(name="ft", replica=0)
    effects = WorkerEffects(
        redis=redis,
        poke_redis=redis,
        slots=HeldSlots(ft=slot),  # type: ignore[arg-type]
        consumer=None,  # type: ignore[arg-type]
        coordination=coordination,
        snapshot=None,  # type: ignore[arg-type]
        worker_id="w1",
        advertise=lambda: None,  # type: ignore[arg-type,return-value]
    )
    assert await effects.take_lease("ft", 0)
    renew = coordination.renew_leases

    async def released_meanwhile(held: list[tuple[str, int]]) -> list[tuple[str, int]]:
        await coordination.release_slot_lease(slot)  # type: ignore[arg-type]  # the unload's release
        return await renew(held)

    monkeypatch.setattr(coordination, "renew_leases", released_meanwhile)
    assert await effects.renew_leases() == []
    assert slot.replica is None
    assert await redis.get(keys.replica_lease("ft", 0)) is None
