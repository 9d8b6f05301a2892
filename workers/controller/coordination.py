"""What workers agree on through Redis: replica leases, failed loads, measured costs, operator requests.

A lease per (model, replica number), taken with `SET NX PX` and renewed on every controller pass,
makes a burst of requests start exactly one load and keeps two workers from adding the same
replica; a worker that dies loses its leases by expiry. Every key comes from `switchboard.keys`.
A change to a failure, a measured cost or an operator request bumps the catalogue version in the
same round trip (`switchboard.catalogue`), so that every controller reads those facts again.
"""

from __future__ import annotations

import statistics
import time

import redis.asyncio as aioredis

from switchboard import keys, lua
from switchboard.catalogue import bump_catalogue
from switchboard.wire import LoadFailure, ModelLimits, encode
from workers.models.slot import ModelSlot

LEASE_TTL_MS = keys.REPLICA_LEASE_TTL_S * 1000


class Coordination:
    """One worker's side of the keys that workers share."""

    def __init__(self, redis: aioredis.Redis, worker_id: str, kind: str) -> None:
        self._redis = redis
        self._worker_id = worker_id
        self._kind = kind
        self._renew = lua.register(redis, "renew_lease")
        self._release = lua.register(redis, "release_lease")

    async def take_lease(self, model: str, replica: int) -> bool:
        """Claim replica `replica` of `model` for this worker; False if someone holds it."""
        taken = await self._redis.set(
            keys.replica_lease(model, replica), self._worker_id, nx=True, px=LEASE_TTL_MS
        )
        return bool(taken)

    async def renew_leases(self, held: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Extend the leases of `held` (model, replica); returns those no longer this worker's."""
        if not held:
            return []
        lease_keys = [keys.replica_lease(model, replica) for model, replica in held]
        lost = await self._renew(keys=lease_keys, args=[self._worker_id, LEASE_TTL_MS])
        return [held[int(position) - 1] for position in lost]

    async def release_lease(self, model: str, replica: int) -> None:
        """Give the replica up (after an unload or a failed load)."""
        await self._release(keys=[keys.replica_lease(model, replica)], args=[self._worker_id])

    async def release_slot_lease(self, slot: ModelSlot) -> None:
        """Give up the replica `slot` holds, if any, and forget it there."""
        # Forgotten before the release is sent: a renewal under way meanwhile finds the lease gone and
        # must not take it again for a slot that gave it up (it would be held, unused, until it expired).
        replica, slot.replica = slot.replica, None
        if replica is not None:
            await self.release_lease(slot.name, replica)

    async def record_failure(
        self, model: str, reason: str, backoff_s: float, in_a_row: int, detail: str = ""
    ) -> LoadFailure:
        """Tell every front door and worker that `model` failed to load; it expires when it may be
        retried. `detail` is for operators (`/admin/models`), never for clients."""
        now = time.time()
        failure = LoadFailure(
            model=model,
            worker_id=self._worker_id,
            reason=reason,
            failed_at=now,
            retry_at=now + backoff_s,
            failures_in_a_row=in_a_row,
            detail=detail,
        )
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(keys.load_failure(model), encode(failure), px=max(1, int(backoff_s * 1000)))
        bump_catalogue(pipe)
        await pipe.execute()
        return failure

    async def clear_failure(self, model: str) -> None:
        """The model loaded: forget its failures."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.delete(keys.load_failure(model))
        bump_catalogue(pipe)
        await pipe.execute()

    async def record_cost(self, model: str, operation: str, value: float) -> None:
        """Keep one measurement (seconds, or bytes for "memory") of `operation` on this worker kind."""
        key = keys.measured_costs(model, self._kind, operation)
        pipe = self._redis.pipeline(transaction=False)
        pipe.lpush(key, f"{value:.6g}")
        pipe.ltrim(key, 0, keys.COST_SAMPLES - 1)
        pipe.expire(key, keys.COST_TTL_S)
        bump_catalogue(pipe)
        await pipe.execute()

    async def publish_limits(self, model: str, limits: ModelLimits) -> None:
        """What the loaded model accepts, for the front doors' checks before anything is queued."""
        await self._redis.set(keys.model_limits(model), encode(limits), ex=keys.MODEL_LIMITS_TTL_S)

    async def consume_load_request(self, model: str) -> None:
        """An operator's load request was carried out: keep-alive rules the model again."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.delete(keys.desired_state(model))
        bump_catalogue(pipe)
        await pipe.execute()


def typical(samples: list[bytes]) -> float | None:
    """The median of recorded samples (newest first), or None when there are none."""
    values = [float(sample) for sample in samples]
    return statistics.median(values) if values else None
