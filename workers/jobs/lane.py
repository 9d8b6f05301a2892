"""The worker's lanes to the front doors on its machine: each chunk sent straight to its front door.

A chunk that goes through Redis alone takes two hops to the request that waits for it; a front door
on this machine, run by the same user, also takes chunks over a Unix socket (`router.queue.lane`,
where the measurements are). For each job's chunk the job runner asks `FrontDoorLanes.send` first:
if the chunk goes out on the lane, its append leaves out the inbox copy; if not (no lane yet, the
front door elsewhere, the lane behind), the append copies it to the inbox as before. The append
itself is never left out: the result stream stays the record, a takeover goes on from it. The
frames leave with the result writer's next batch of appends, just before it (`flush`): written on
their own, a write per turn of the worker's loop, they woke the front door more often than the
batches had, and cost the two cores more than the hop saved from 8 streams on (bench/README.md).

A lane is looked up (`keys.router_lane`) and connected in the background the first time a front door
is named, so no chunk waits for that; the chunks before it is up go through Redis. A front door
whose address is missing, or whose socket cannot be reached from here (another machine, another
container), is tried again after `RETRY_S`.

Chunks go out on the lane only while `fresh` says so: while this worker's record is sure to be in
Redis (the heartbeat; no other worker takes over a job while its worker's record lives, so a worker
that stalled past its record's expiry never sends a chunk of a job another worker now answers) and
its last flush of chunks went through (the result writer's `healthy`: while Redis is away, no more
chunks are shown that it may never record). Used only when the front door turns it on
(`router.chunk_lane`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard import keys
from switchboard.chunk_lane import chunk_frame, hello, lane_address_decoder
from switchboard.wire import Job

logger = logging.getLogger(__name__)

# A front door without a lane reachable from here is looked up again after this long.
RETRY_S = 30.0
# Bytes written to a lane and not yet taken by its front door, past which chunks go through Redis
# instead (its front door is behind; they will come through the inbox, or a read of the stream).
MAX_BEHIND_BYTES = 1 << 20


class _Lane(asyncio.Protocol):
    """One front door's lane: looked up, connected, or down until `retry_at`."""

    def __init__(self) -> None:
        self.transport: asyncio.WriteTransport | None = None
        self.retry_at = 0.0
        self.looking = False
        # The frames sent since the last flush (`FrontDoorLanes.flush`), written together.
        self.frames: list[bytes] = []

    def flush(self) -> None:
        frames, self.frames = self.frames, []
        if frames and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(frames))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.retry_at = time.monotonic() + RETRY_S

    def usable(self) -> bool:
        transport = self.transport
        return (
            transport is not None
            and not transport.is_closing()
            and transport.get_write_buffer_size() <= MAX_BEHIND_BYTES
        )


class FrontDoorLanes:
    """This worker's lanes, one per front door that named it a job, on this machine."""

    def __init__(self, redis: aioredis.Redis, *, fresh: Callable[[], bool]) -> None:
        self._redis = redis
        self._fresh = fresh
        self._lanes: dict[str, _Lane] = {}
        self._lookups: set[asyncio.Task[None]] = set()

    def send(self, job: Job, position: int, chunk: bytes, served_by: str | None = None) -> bool:
        """Send the job's chunk at `position` (its entry `0-<position>`) to the job's front door;
        whether it went out (else its append copies it to the inbox). `served_by`: the model that
        serves the job, with this worker's first chunk of it."""
        if job.router_id is None or not self._fresh():
            return False
        lane = self._lanes.get(job.router_id)
        if lane is None or (
            lane.transport is None and not lane.looking and time.monotonic() >= lane.retry_at
        ):
            self._look_up(job.router_id)
            return False
        if not lane.usable():
            return False
        model = served_by.encode() if served_by else b""
        lane.frames.append(chunk_frame(keys.result_stream(job.id).encode(), position, chunk, model))
        return True

    def flush(self) -> None:
        """Write what was sent since the last flush, one write per front door. The result writer
        calls it as it sends each batch of appends to Redis (`ResultWriter`'s `before_flush`): a
        front door is woken once per batch, as the batch's inbox copies woke it, a hop sooner."""
        for lane in self._lanes.values():
            lane.flush()

    async def close(self) -> None:
        """Stop looking up and close every lane."""
        for task in list(self._lookups):
            task.cancel()
        await asyncio.gather(*self._lookups, return_exceptions=True)
        for lane in self._lanes.values():
            if lane.transport is not None:
                lane.transport.close()
        self._lanes.clear()

    def _look_up(self, router_id: str) -> None:
        lane = self._lanes.setdefault(router_id, _Lane())
        lane.looking = True
        task = asyncio.create_task(self._connect(router_id, lane), name=f"lane to {router_id}")
        self._lookups.add(task)
        task.add_done_callback(self._lookups.discard)

    async def _connect(self, router_id: str, lane: _Lane) -> None:
        try:
            raw = await self._redis.get(keys.router_lane(router_id))
            if raw is None:
                raise OSError("the front door advertises no lane")
            address = lane_address_decoder.decode(raw)
            loop = asyncio.get_running_loop()
            transport, _ = await loop.create_unix_connection(lambda: lane, address.path)
            transport.write(hello(address.token))
            lane.transport = transport
        except (OSError, RedisError, msgspec.DecodeError) as exc:
            logger.debug("no lane to a front door", extra={"router_id": router_id, "error": str(exc)})
            lane.retry_at = time.monotonic() + RETRY_S
            self._forget_down_lanes()
        finally:
            lane.looking = False

    def _forget_down_lanes(self) -> None:
        """Drop the lanes that are down and due for a retry anyway (front doors that may be gone)."""
        now = time.monotonic()
        for router_id, lane in list(self._lanes.items()):
            if lane.transport is None and not lane.looking and now >= lane.retry_at:
                with contextlib.suppress(KeyError):
                    del self._lanes[router_id]
