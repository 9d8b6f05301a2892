"""One reader loop per front-door process for the results of all in-flight jobs.

A blocking read per request would tie up a Redis connection each; instead one task issues a single
``XREAD BLOCK`` and hands each chunk, with its entry id, to the request waiting for it. Most of what
it reads comes from one key: this front door's inbox (`keys.inbox`). A worker's append script
copies every chunk of a job queued here into it, with the job's result stream and the chunk's entry
id there (`switchboard/lua/append_chunk.lua`), so a new request needs no wake poke and each read
blocks on one key, not on one per job in flight: the reads cost Redis and this process the same
whether 1 or 1,000 streams are open. What was read is trimmed from the inbox on a later pass.

A job's result stream stays the record of its answer, and a subscription reads it itself ("direct")
whenever the inbox may not bring it all: a resumed stream (its job may be another front door's, and
what its client missed is only there), a gap in what the inbox brought (copies trimmed before they
were read), and a job of which nothing came for `QUIET_S` (its writer may not copy to the inbox: an
older worker; or it waits in line). A chunk the inbox brings in order for a direct subscription
makes it inbox-fed again. Direct streams are read from their start (or, for a resumed stream, from
after the entry its client saw last), so a chunk written before the request subscribed is not lost,
and chunks that come both ways are handed over once. One job may have several readers here (clients
resuming one stream, say from two tabs), each from its own point: its stream is read from the
earliest of them, and each gets the chunks past its own.

The loop also notices a Redis that restarted (its run id changed), on its first pass after Redis
answers again: a job that did not survive the restart can never finish, and its request is failed at
once instead of waiting for its deadline. A job survived if its record (`keys.job_record`, written
with the job and deleted only with its results) is there and, once its first chunk was read, its
result stream too. Nothing else traffic writes can bring the record back (unlike its model's job
stream, which the next enqueue creates again). A check that fails (Redis still loading its data, a
pooled connection from before the restart) is repeated on the next pass: the restart is remembered
only once it was checked. With append-only persistence everything survives, and reading simply goes
on.

Writes can be lost without a restart this front door sees, too (a replica promoted before it had
them): result entries are `0-1`, `0-2`, ... in order (`append_chunk.lua`), so a gap after the last
entry a reader had means chunks are missing, and its request fails as one lost in a restart, rather
than skip text.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from router.queue.subscription import START, ResultsLost, Subscription, entry_order, skips_entries
from router.status.redis_health import RedisHealth
from switchboard import keys
from switchboard.redis_conn import is_connection_error, server_run_id, stream_entries
from switchboard.tasks import TaskSet
from switchboard.wire import Chunk, chunk_decoder

logger = logging.getLogger(__name__)

# A subscription fed by the inbox that got nothing for this long has its result stream read as well.
QUIET_S = 0.5
# How long one XREAD may block: a subscription gone quiet is read directly from the pass after. A
# resumed subscription wakes the read early (a poke in the inbox).
BLOCK_MS = int(QUIET_S * 1000)
# What was read from the inbox is trimmed with the next pass that writes anyway (the cleaning up of
# ended jobs), or once this many entries wait to be trimmed.
TRIM_EVERY = 512
# After a Redis error the loop backs off this long before trying again; after a lost connection,
# only briefly (a connection from before a restart fails once, and the next one works).
RETRY_DELAY_S = 0.5
RECONNECT_DELAY_S = 0.1
# While jobs are in flight, Redis's run id is compared this often (and after every failed read).
RUN_ID_CHECK_S = 5.0

_CHUNK = keys.CHUNK_FIELD.encode()
_SERVED_BY = keys.SERVED_BY_FIELD.encode()
_RESULT_STREAM = keys.INBOX_STREAM_FIELD.encode()
_RESULT_ENTRY = keys.INBOX_ENTRY_FIELD.encode()


class ResultReader:
    """Reads every in-flight result stream of this process through one Redis connection."""

    def __init__(self, redis: aioredis.Redis, router_id: str, health: RedisHealth) -> None:
        self._redis = redis
        self._health = health
        self._inbox_key = keys.inbox(router_id).encode()
        self._inbox_last_id = b"0-0"
        self._untrimmed = 0  # inbox entries read and not trimmed yet
        # Result stream key → its job's subscriptions in this process (one per reader).
        self._subscriptions: dict[bytes, list[Subscription]] = {}
        # Jobs whose subscription ended, with how long their results (and record) are kept: deleted
        # at once (None), or expiring after that many seconds.
        self._ended: list[tuple[str, int | None]] = []
        self._has_work = asyncio.Event()
        self._run_id: str | None = None
        # Subscriptions whose enqueue had not returned when a restart was noticed.
        self._unjudged: list[Subscription] = []
        self._check_run_id_at = 0.0
        # True while an XREAD is in flight: only then must a new subscription wake the reader.
        self.blocked = False

    def subscribe(
        self,
        job_id: str,
        model: str,
        after: str = START,
        *,
        streamed: bool = False,
        queued: bool = False,
        from_inbox: bool = False,
    ) -> Subscription:
        """Start delivering the chunks of `job_id` (a job of `model`) that follow entry `after`;
        `streamed`: they go to a streamed response (see `Subscription.streamed`); `queued`: the job is
        in Redis already (else the caller sets `Subscription.queued` once it is); `from_inbox`: a job
        this front door queues, whose chunks come to its inbox (else its result stream is read, which
        a blocked read picks up on its next pass: `wake` makes that now)."""
        subscription = Subscription(job_id, model, after, streamed=streamed, from_inbox=from_inbox)
        subscription.quiet_at = asyncio.get_running_loop().time() + QUIET_S
        subscription.queued = queued
        self._subscriptions.setdefault(subscription.stream_key, []).append(subscription)
        self._has_work.set()
        return subscription

    def subscribe_ended(self, job_id: str, model: str, last: str) -> Subscription:
        """A streamed reader of `job_id` whose client already had entry `last`, the job's last chunk:
        nothing is left to deliver, nothing is read, and it is released as one read to its end."""
        subscription = Subscription(job_id, model, last, streamed=True)
        subscription.read_to_end = subscription.finished = True
        return subscription

    def unsubscribe(self, subscription: Subscription, *, keep: bool = False) -> None:
        """Stop delivering. The job's result stream and record are deleted on the reader's next pass,
        unless `keep`: then they stay until they expire, for a client that resumes the stream
        (`Last-Event-ID`); so does a streamed answer read to its end, for a while. Idempotent."""
        if subscription.released:
            return
        subscription.released = True
        others = self._drop(subscription)
        keep_s: int | None = None
        if keep or others:  # another reader here still reads the job's results
            keep_s = keys.RESULT_TTL_S
        elif subscription.read_to_end and subscription.streamed:
            keep_s = keys.FINISHED_RESULT_TTL_S
        self._ended.append((subscription.job_id, keep_s))
        self._has_work.set()

    def _drop(self, subscription: Subscription) -> int:
        """Take `subscription` out of those read; how many others of its job are left."""
        others = self._subscriptions.get(subscription.stream_key, [])
        if subscription in others:
            others.remove(subscription)
        if not others:
            self._subscriptions.pop(subscription.stream_key, None)
        return len(others)

    async def wake(self) -> None:
        """Make a blocked read return, so that it picks up a new subscription at once."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.xadd(self._inbox_key, {keys.WAKE_FIELD: ""}, maxlen=keys.INBOX_MAX_ENTRIES, approximate=True)
        pipe.expire(self._inbox_key, keys.INBOX_TTL_S)
        await pipe.execute()

    @property
    def in_flight(self) -> int:
        """How many readers of jobs' results this process serves (a job read by several counts each)."""
        return sum(len(subscriptions) for subscriptions in self._subscriptions.values())

    def start(self, tasks: TaskSet) -> None:
        """Start the reader loop as a task of `tasks` (its blocking XREAD does not fit `poll`)."""
        tasks.start(self._run(), "result reader")

    async def _run(self) -> None:
        while True:
            try:
                await self._read_once()
            except asyncio.CancelledError:
                raise
            except RedisError as exc:
                if not is_connection_error(exc):
                    logger.exception("result reader failed; retrying", extra={"in_flight": self.in_flight})
                    await asyncio.sleep(RETRY_DELAY_S)
                    continue
                # Redis may be down, or may have restarted: whatever answers next, its run id is
                # compared first. Requests find out for themselves whether it is down.
                if self._check_run_id_at:
                    logger.warning("result reader lost its connection", extra={"error": str(exc)})
                self._check_run_id_at = 0.0
                await asyncio.sleep(RECONNECT_DELAY_S)
            except Exception:
                logger.exception("result reader failed; retrying", extra={"in_flight": self.in_flight})
                await asyncio.sleep(RETRY_DELAY_S)

    async def _read_once(self) -> None:
        if not self._subscriptions:
            if self._ended:
                await self._clean_up_ended()
                return  # a subscription may have come meanwhile: look again before waiting
            self._has_work.clear()
            await self._has_work.wait()
            return
        loop = asyncio.get_running_loop()
        if loop.time() >= self._check_run_id_at:
            await self._check_restart()
            self._check_run_id_at = loop.time() + RUN_ID_CHECK_S
        if self._unjudged:
            await self._judge_enqueued()
        streams = self._streams_to_read(loop.time())
        self.blocked = True
        try:
            response = await self._read(streams)
        finally:
            self.blocked = False
        for stream_key, entries in stream_entries(response):
            if stream_key == self._inbox_key:
                self._dispatch_inbox(entries)
            else:
                self._dispatch(stream_key, entries)

    def _streams_to_read(self, now: float) -> dict[bytes, bytes]:
        """The inbox, and the result streams read directly, each from the earliest point any of its
        readers needs."""
        streams = {self._inbox_key: self._inbox_last_id}
        for key, subs in self._subscriptions.items():
            direct = False
            for sub in subs:
                if not sub.direct and now >= sub.quiet_at:
                    sub.direct = True  # nothing came from the inbox for a while: read it itself
                direct = direct or sub.direct
            if direct:
                streams[key] = min((sub.last_id for sub in subs), key=entry_order)
        return streams

    async def _read(self, streams: dict[bytes, bytes]) -> Any:
        """XREAD BLOCK over `streams`; the results of jobs that ended since the last read are deleted
        in the same round trip (a pass that sent them first read a round trip later, and with it
        every chunk it read), and so is what was read of the inbox."""
        if not self._ended and self._untrimmed < TRIM_EVERY:
            return await self._redis.xread(streams, block=BLOCK_MS)  # type: ignore[arg-type]
        return (await self._clean_up_ended(then_read=streams))[-1]

    async def flush_ended(self, timeout_s: float) -> None:
        """Delete (or bound) now, within `timeout_s`, the results of jobs that ended since the reader's
        last pass: for a stopping front door, whose reader, stopped, takes no next pass. Left undone,
        they would stay until their writer's expiry (`keys.RESULT_TTL_S`). A failure is logged."""
        if not self._ended:
            return
        try:
            async with asyncio.timeout(timeout_s):
                await self._clean_up_ended()
        except (RedisError, TimeoutError) as exc:
            logger.warning(
                "could not delete the results of the last jobs read",
                extra={"jobs": len(self._ended), "error": str(exc)},
            )

    async def _clean_up_ended(self, then_read: dict[bytes, bytes] | None = None) -> list[Any]:
        """Delete (or bound) the results of the jobs that ended since the last pass and trim what was
        read from the inbox, in one round trip; with `then_read`, an XREAD BLOCK of those streams
        last in it. Its replies."""
        ended, self._ended = self._ended, []
        pipe = self._redis.pipeline(transaction=False)
        _clean_up(pipe, ended)
        if self._untrimmed:
            # Entries before the last one read go; a writer's MAXLEN bounds what a reader leaves.
            pipe.xtrim(self._inbox_key, minid=self._inbox_last_id, approximate=False)
        if then_read is not None:
            pipe.xread(then_read, block=BLOCK_MS)  # type: ignore[arg-type]
        try:
            replies = await pipe.execute()
        except BaseException:
            self._ended.extend(ended)
            raise
        self._untrimmed = 0
        return replies

    async def _check_restart(self) -> None:
        """Fail the subscriptions whose job a Redis restart lost; remember the server's run id once
        that is done (a check that raises is repeated whole on the next pass)."""
        run_id = await server_run_id(self._redis)
        self._health.mark_up()
        if self._run_id is not None and self._run_id != run_id:
            # Another server's inbox: its entry ids owe nothing to the last one read here.
            self._inbox_last_id, self._untrimmed = START.encode(), 0
            subscriptions = [sub for subs in self._subscriptions.values() for sub in subs]
            lost = await self._fail_lost([sub for sub in subscriptions if sub.queued])
            # A job still being enqueued may not be in Redis yet: it is judged once it is.
            self._unjudged = [sub for sub in subscriptions if not sub.queued]
            logger.warning(
                "redis restarted", extra={"run_id": run_id, "in_flight": len(subscriptions), "lost": lost}
            )
        self._run_id = run_id

    async def _judge_enqueued(self) -> None:
        """Judge the jobs that were being enqueued when a restart was noticed, once they are queued."""
        ready = [sub for sub in self._unjudged if sub.queued or sub.released]
        if not ready:
            return
        await self._fail_lost([sub for sub in ready if not sub.released])
        self._unjudged = [sub for sub in self._unjudged if sub not in ready]

    async def _fail_lost(self, subscriptions: list[Subscription]) -> int:
        """Fail those of `subscriptions` whose job is not in Redis (as it is now); how many."""
        pipe = self._redis.pipeline(transaction=False)
        for subscription in subscriptions:
            pipe.exists(keys.job_record(subscription.job_id))
            pipe.exists(subscription.stream_key)
        found = await pipe.execute()
        lost = 0
        for index, subscription in enumerate(subscriptions):
            has_record, has_results = found[2 * index], found[2 * index + 1]
            # Before its first chunk a job has no results yet; after it, they must be there. Its
            # record, unlike its model's queue, is written by nothing but its own enqueue.
            started = subscription.last_id != START.encode()
            if has_record and (has_results or not started):
                continue
            lost += 1
            self._drop(subscription)
            subscription.fail(ResultsLost(subscription.job_id))
        return lost

    def _dispatch_inbox(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        """Hand out the chunks copied to the inbox (wake pokes carry none), each job's in order."""
        self._inbox_last_id = entries[-1][0]
        self._untrimmed += len(entries)
        for _, fields in entries:
            stream_key = fields.get(_RESULT_STREAM)
            if stream_key is None:
                continue  # a wake poke
            subscriptions = self._subscriptions.get(stream_key)
            if not subscriptions:
                continue  # a job nobody here reads (any more)
            chunk = chunk_decoder.decode(fields[_CHUNK])
            served_by = fields.get(_SERVED_BY)
            for subscription in list(subscriptions):
                if served_by is not None:
                    subscription.served_by = served_by.decode()
                self._deliver_copy(subscription, fields[_RESULT_ENTRY], chunk)

    def _deliver_copy(self, subscription: Subscription, entry_id: bytes, chunk: Chunk) -> None:
        """Hand `subscription` an inbox copy of entry `entry_id` if it is the next one it needs;
        one that leaves out entries has its result stream read for them instead."""
        after, order = entry_order(subscription.last_id), entry_order(entry_id)
        if order <= after:
            return  # it came the other way already
        if skips_entries(after, order):
            subscription.direct = True
            return
        subscription.direct = False
        self._deliver(subscription, [(entry_id, chunk)])

    def _dispatch(self, stream_key: bytes, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        subscriptions = self._subscriptions.get(stream_key)
        if not subscriptions:  # unsubscribed while the read was in flight
            return
        chunks = [(entry_id, chunk_decoder.decode(fields[_CHUNK])) for entry_id, fields in entries]
        served_by = next((fields[_SERVED_BY] for _, fields in entries if _SERVED_BY in fields), None)
        # A copy: a subscription that takes its last chunk leaves the list.
        for subscription in list(subscriptions):
            if served_by is not None:
                subscription.served_by = served_by.decode()
            self._deliver(subscription, chunks)

    def _deliver(self, subscription: Subscription, chunks: list[tuple[bytes, Chunk]]) -> None:
        """Hand `subscription` the chunks past its own point (the read began at the earliest reader's)."""
        after = entry_order(subscription.last_id)
        for entry_id, chunk in chunks:
            order = entry_order(entry_id)
            if order <= after:
                continue
            if skips_entries(after, order):
                # Written and lost (a replica promoted before it had them): never skip text.
                logger.warning("result chunks lost", extra={"job_id": subscription.job_id})
                self._drop(subscription)
                subscription.fail(ResultsLost(subscription.job_id))
                return
            after = order
            subscription.last_id = entry_id
            subscription.quiet_at = asyncio.get_running_loop().time() + QUIET_S
            subscription.deliver(entry_id.decode(), chunk)
            if chunk.is_last:
                # Nothing follows: stop reading the stream; it is deleted on the next pass (its
                # chunks are in this process now), or kept a while for a streamed answer.
                subscription.read_to_end = True
                self.unsubscribe(subscription)
                return


def _clean_up(pipe: Any, ended: list[tuple[str, int | None]]) -> None:
    """Delete the results (and records) of jobs whose readers here ended, or bound how long they stay."""
    for job_id, keep_s in ended:
        results, record = keys.result_stream(job_id), keys.job_record(job_id)
        if keep_s is None:
            pipe.unlink(results, record)
        else:
            # Its writer sets an expiry too; this bounds it even if the writer never wrote again.
            pipe.expire(results, keep_s)
            pipe.expire(record, keep_s)
