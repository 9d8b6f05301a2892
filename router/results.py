"""One reader loop per front-door process for the result streams of all in-flight jobs.

A blocking read per request would tie up a Redis connection each; instead one task issues a single
``XREAD BLOCK`` over every in-flight job's result stream (plus this process's wake stream) and hands
each chunk to the request waiting for it. Streams are read from their start, so a chunk written
before the request subscribed is not lost.
"""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis

from switchboard import keys
from switchboard.redis_conn import stream_entries
from switchboard.tasks import cancel_and_wait
from switchboard.wire import Chunk, chunk_decoder

logger = logging.getLogger(__name__)

# How long one XREAD may block. New subscriptions wake it early through the wake stream, so this
# only bounds how often an idle front door polls.
BLOCK_MS = 5_000
# After a Redis error the loop backs off this long before trying again.
RETRY_DELAY_S = 0.5


class Subscription:
    """The chunks of one job, in order, as the reader loop delivers them."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.stream_key = keys.result_stream(job_id).encode()
        self.last_id = b"0-0"
        self.finished = False
        self._queue: asyncio.Queue[Chunk] = asyncio.Queue()

    def deliver(self, chunk: Chunk) -> None:
        """Called by the reader loop for every chunk read from the job's result stream."""
        self._queue.put_nowait(chunk)

    async def get(self, deadline: float) -> Chunk:
        """The next chunk; TimeoutError past `deadline` (loop time)."""
        if self._queue.empty():
            async with asyncio.timeout_at(deadline):
                chunk = await self._queue.get()
        else:
            chunk = self._queue.get_nowait()
        # Marked before the caller sees it: a caller that stops at the last chunk has not left early.
        self.finished = chunk.is_last
        return chunk


class ResultReader:
    """Reads every in-flight result stream of this process through one Redis connection."""

    def __init__(self, redis: aioredis.Redis, router_id: str) -> None:
        self._redis = redis
        self._wake_key = keys.wake_stream(router_id).encode()
        self._wake_last_id = b"0-0"
        self._subscriptions: dict[bytes, Subscription] = {}
        self._finished_keys: list[bytes] = []
        self._has_work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # True while an XREAD is in flight: only then must a new subscription wake the reader.
        self.blocked = False

    @property
    def wake_key(self) -> str:
        """The stream to poke so that a blocked read returns and picks up new subscriptions."""
        return self._wake_key.decode()

    def subscribe(self, job_id: str) -> Subscription:
        """Start delivering the chunks of `job_id`."""
        subscription = Subscription(job_id)
        self._subscriptions[subscription.stream_key] = subscription
        self._has_work.set()
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        """Stop delivering; the result stream is deleted on the reader's next pass."""
        if self._subscriptions.pop(subscription.stream_key, None) is not None:
            self._finished_keys.append(subscription.stream_key)
            self._has_work.set()

    @property
    def in_flight(self) -> int:
        """How many jobs this process is waiting on."""
        return len(self._subscriptions)

    def start(self) -> None:
        """Start the reader loop."""
        self._task = asyncio.create_task(self._run(), name="result-reader")

    async def stop(self) -> None:
        """Stop the reader loop; idempotent."""
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self._read_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("result reader failed; retrying", extra={"in_flight": self.in_flight})
                await asyncio.sleep(RETRY_DELAY_S)

    async def _read_once(self) -> None:
        if self._finished_keys:
            finished, self._finished_keys = self._finished_keys, []
            await self._redis.unlink(*finished)
        if not self._subscriptions:
            self._has_work.clear()
            await self._has_work.wait()
            return
        streams = {self._wake_key: self._wake_last_id}
        streams.update((key, sub.last_id) for key, sub in self._subscriptions.items())
        self.blocked = True
        try:
            response = await self._redis.xread(streams, block=BLOCK_MS)  # type: ignore[arg-type]
        finally:
            self.blocked = False
        for stream_key, entries in stream_entries(response):
            self._dispatch(stream_key, entries)

    def _dispatch(self, stream_key: bytes, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        if stream_key == self._wake_key:
            self._wake_last_id = entries[-1][0]
            return
        subscription = self._subscriptions.get(stream_key)
        if subscription is None:  # unsubscribed while the read was in flight
            return
        for entry_id, fields in entries:
            subscription.last_id = entry_id
            chunk = chunk_decoder.decode(fields[b"c"])
            subscription.deliver(chunk)
            if chunk.is_last:
                # Nothing follows: stop reading the stream and delete it on the next pass.
                self.unsubscribe(subscription)
                return
