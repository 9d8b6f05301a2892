"""Take jobs from the model streams, run them through the local Triton models, append their chunks.

Each pass reads the job streams of the models that are warm on this worker right now, each stream
with the count its model is allotted (`workers.jobs.shares`: a reserve per warm model, weighted
shares of the rest, no more than its engine batches, never more than the free slots; the reads
themselves are `workers.jobs.reads`). A model whose last read came back full may have more jobs
waiting: it is read without blocking first; otherwise the pass blocks on all the allotted streams.
The set is rebuilt every pass; with no model warm the consumer waits for one. Jobs of a model
nobody holds, or beyond what a model may take here, stay in its stream for any worker. A job is
acknowledged in the same round trip as its last chunk, so a worker that dies mid-job leaves it
pending, and another worker's sweep puts it back in line (`workers.jobs.takeover`); the worker that
takes it goes on where the client's stream stopped (`workers.jobs.continuation`). An entry that
cannot be decoded goes to the dead-letter stream; nothing that goes wrong in one pass stops the loop.

Inside one model's allotment its jobs are taken tier by tier (`wire.TIERS`): priority, then default,
then flex, each tier a stream of its own, read in order in one script (`workers.jobs.reads`). The
batch tier (the Batch API's lines) comes last and takes only slots no interactive job wants: none
while any warm model is known to have interactive jobs waiting or is held back, never the last free
slot of a warm model (its reserve) nor its engine's last sequence, and at most `max_batch_jobs`
lines at once. Batch lines taken in a read stay in the read: interactive jobs of the same model
that arrived before them are taken first.

Shadow copies of routed requests (`Job.shadow`, `router.routing.rollouts.shadow`) come last: nobody waits for
them, so one runs only while the worker has slots to spare — fewer than `max_shadow_jobs` of them
running, a slot free once the real jobs of the same read have theirs, and no real job left waiting
(no model's read came back full, and none was held back). Otherwise it is acknowledged at once
with a "shadow_dropped" error, which its front door counts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from switchboard import keys, lua
from switchboard.demand import DemandIndex
from switchboard.redis_conn import stream_entries
from switchboard.tasks import TaskSet, first_of, poll
from switchboard.wire import TIERS, JobError
from workers.jobs import reads, shares
from workers.jobs.orphans import ORPHAN_GRACE_S, OrphanWatch
from workers.jobs.run import JobRunner
from workers.jobs.takeover import Entry, Takeover, dead_letter, decode_entry
from workers.jobs.wakeable_read import WakeableRead
from workers.jobs.writer import ResultWriter
from workers.models.slot import ModelSlot, SlotNotServing
from workers.models.slots import Slots
from workers.runtime.worker_metrics import SLOT_WAIT

logger = logging.getLogger(__name__)

# Short, so that a model that just became warm is read within a quarter second even while the
# consumer is blocked on the other models' streams. A read that blocks while a model with jobs
# waiting is held back is ended as soon as a slot frees (`workers.jobs.wakeable_read`).
BLOCK_MS = 250
RETRY_DELAY_S = 0.5
# Waiting jobs answered per round trip when a model cannot be loaded.
REFUSE_BATCH = 256
# The answer to a shadow copy that found no slot to spare.
SHADOW_DROPPED = JobError(
    code="shadow_dropped", message="the worker had no slot to spare for a shadow copy; it was dropped"
)


class JobConsumer:
    """Runs jobs for the warm models of one worker, at most `max_concurrent_jobs` at once."""

    def __init__(
        self,
        redis: aioredis.Redis,
        writer: ResultWriter,
        *,
        worker_id: str,
        slots: Slots,
        max_concurrent_jobs: int,
        fair_shares: bool = True,
        max_shadow_jobs: int | None = None,
        max_batch_jobs: int | None = None,
        batch_jobs_beside_interactive: int | None = None,
        max_deliveries: int = 3,
        takeover_check_s: float = 2.0,
        orphan_grace_s: float = ORPHAN_GRACE_S,
        on_failure: Callable[[], None] = lambda: None,
    ) -> None:
        """`on_failure` is called if the loop that takes jobs ends while the consumer is not stopping;
        `max_shadow_jobs` (None: a quarter of `max_concurrent_jobs`) bounds the shadow copies running,
        `max_batch_jobs` (None: half of it) the batch lines, and `batch_jobs_beside_interactive`
        (None: an eighth of those) the batch lines started while interactive jobs run;
        `fair_shares` False shares the slots in turn, without reserves, weights or priorities."""
        self._redis = redis
        self._worker_id = worker_id
        self._slots = slots
        self._by_stream = {
            stream: slot for name, slot in slots.items() for stream in keys.job_streams(name, TIERS)
        }
        self._take_in_order = lua.register(redis, "take_in_order")
        self._demand = DemandIndex(redis)
        self._max_jobs = max_concurrent_jobs
        self._fair = fair_shares
        # The warm models whose last read came back full: more of their jobs may be waiting.
        self._hungry: set[str] = set()
        # The last read that could take batch lines took all it might: more may be waiting, and a
        # batch line's end (its slot free again) ends a blocking read at once.
        self._batch_waiting = False
        # Moves on every read, so that ties between models fall to each in turn.
        self._turn = 0
        self._max_shadow_jobs = max_concurrent_jobs // 4 if max_shadow_jobs is None else max_shadow_jobs
        self._shadow_jobs: set[asyncio.Task[None]] = set()
        self._max_batch_jobs = max_concurrent_jobs // 2 if max_batch_jobs is None else max_batch_jobs
        beside = batch_jobs_beside_interactive
        self._batch_jobs_beside = max(1, self._max_batch_jobs // 8) if beside is None else beside
        self._batch_jobs: set[asyncio.Task[None]] = set()
        self._takeover = Takeover(redis, writer, worker_id=worker_id, max_deliveries=max_deliveries)
        self._takeover_check_s = takeover_check_s
        self._on_failure = on_failure
        self._jobs: set[asyncio.Task[None]] = set()
        self._pooling_jobs: set[asyncio.Task[None]] = set()
        # The entries of the running jobs, to put back in line if they outlast a drain.
        self._entries: dict[asyncio.Task[None], Entry] = {}
        self._slot_freed = asyncio.Event()
        # The blocking read made while a model with jobs waiting is held back: a freed slot ends it.
        self._held_back_read = WakeableRead(redis)
        # An adapter is warm milliseconds after its first job arrives: a read blocked on the other
        # streams then would hold that job for up to BLOCK_MS, many times the adapter's load. So
        # while a base of adapters is warm here, blocking reads are wakeable, and a model that
        # becomes warm ends the one under way.
        slots.on_state_changed(self._slot_changed)
        self._orphans = OrphanWatch(redis, grace_s=orphan_grace_s)
        self._runner = JobRunner(redis, writer, worker_id=worker_id, orphans=self._orphans)
        # Taking jobs (the reader and the takeover sweep) stops before the running jobs drain;
        # the orphan watch goes on until they have.
        self._taking = TaskSet("job consumer")
        self._watching = TaskSet("job consumer")
        self._reader: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def running(self) -> int:
        """Jobs in progress."""
        return len(self._jobs)

    @property
    def reading(self) -> bool:
        """Whether the loop that takes jobs is running (the heartbeat beats only while it is)."""
        return self._reader is not None and not self._reader.done()

    async def start(self) -> None:
        """Join the consumer group of every model stream and start taking jobs.

        Groups are created at id 0 for every model this worker may hold, so jobs enqueued before
        any worker joined are not lost.
        """
        self._stopping = False
        await self._ensure_groups(list(self._by_stream))
        self._reader = self._taking.start(self._read_loop(), "take jobs")
        self._reader.add_done_callback(self._reader_ended)
        self._taking.start(
            poll(self._sweep, self._takeover_check_s, "look for jobs of dead workers", log=logger),
            "take over jobs of dead workers",
        )
        self._watching.start(self._orphans.run(), "watch running jobs' clients")

    async def stop_taking(self) -> None:
        """Take no new jobs (the first step of a stop: jobs still waiting go to other workers)."""
        self._stopping = True
        await self._taking.stop()
        self._reader = None

    async def stop(self, drain_timeout_s: float) -> None:
        """Take no new jobs; let running ones finish for `drain_timeout_s`, then hand them back.

        A job still running then is cancelled and put back in line for another worker, which
        continues it where its client's stream stopped.
        """
        await self.stop_taking()
        try:
            await self._drain(drain_timeout_s)
        finally:
            # Watched to the end: a draining job whose front door dies is not generated for nobody.
            await self._watching.stop()
            await self._held_back_read.close()

    async def _drain(self, timeout_s: float) -> None:
        if not self._jobs:
            return
        _, still_running = await asyncio.wait(self._jobs, timeout=timeout_s)
        unfinished = [self._entries[task] for task in still_running if task in self._entries]
        for task in still_running:
            task.cancel()
        await asyncio.gather(*still_running, return_exceptions=True)
        for entry in unfinished:
            await self._hand_back(entry)

    async def refuse_waiting(self, model: str, error: JobError) -> int:
        """Answer every job waiting for `model` with `error` (its load failed); returns how many."""
        return sum([await self._refuse_stream(stream, error) for stream in keys.job_streams(model, TIERS)])

    async def _refuse_stream(self, stream: str, error: JobError) -> int:
        refused = 0
        while True:
            response = await self._redis.xreadgroup(
                keys.JOB_GROUP, self._worker_id, {stream: ">"}, count=REFUSE_BATCH
            )
            entries = [entry for _, stream_entries_ in stream_entries(response) for entry in stream_entries_]
            if not entries:
                return refused
            for entry_id, fields in entries:
                entry = await self._decoded(stream, entry_id, fields)
                if entry is not None:
                    await self._runner.fail(entry, error, create=True)
                    refused += 1

    async def _ensure_groups(self, streams: list[str]) -> None:
        for stream in streams:
            try:
                await self._redis.xgroup_create(stream, keys.JOB_GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    # --- the loops ------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        while True:
            try:
                await self._read_pass()
                await reads.let_taken_jobs_start()
            except Exception:
                # One bad pass must not end the loop: the worker would hold its models and serve nothing.
                logger.exception("taking jobs failed; going on", extra={"worker_id": self._worker_id})
                await asyncio.sleep(RETRY_DELAY_S)

    async def _read_pass(self) -> None:
        self._slots.changed.clear()
        warm = self._slots.warm()
        if not warm:
            await self._slots.changed.wait()
            return
        self._hungry &= {slot.name for slot in warm}
        demands = [self._demand_of(slot) for slot in warm]
        allotted = self._allot(demands, pooling={slot.name for slot in warm if slot.model.pooling})
        if not allotted:  # the slots are taken, or every warm model runs all its engine batches
            self._slot_freed.clear()
            await first_of(self._slot_freed, self._slots.changed, timeout_s=BLOCK_MS / 1000)
            return
        # Models with jobs waiting that take none on this read: their share (or the free slots) is
        # taken, or their engine's batch is full.
        held_back = any(d.hungry and d.room > 0 and d.name not in allotted for d in demands)
        at_batch = any(d.hungry and d.room == 0 for d in demands)
        batch = 0 if held_back or self._hungry else self._batch_room(len(warm))
        lines_each = batch_shares(demands, allotted, batch, self._turn)
        takes = {
            name: reads.Take(tuple(keys.job_streams(name, TIERS)), count, lines_each.get(name, 0))
            for name, count in allotted.items()
        }
        with self._slots.reading():
            await self._read_allotted(takes, held_back=held_back, at_batch=at_batch)

    def _allot(self, demands: list[shares.ModelDemand], *, pooling: set[str]) -> dict[str, int]:
        """Jobs each warm model may take on this read. A pooling model's jobs hold no job slot: each
        lasts milliseconds and rides in a batch, so its engine's batch alone bounds them."""
        free = self._max_jobs - (len(self._jobs) - len(self._pooling_jobs))
        generating = [demand for demand in demands if demand.name not in pooling]
        allotted = {}
        if free > 0 and generating:
            allotted = shares.allot(free, generating, total=self._max_jobs, turn=self._turn, fair=self._fair)
            self._turn += 1
        allotted.update({d.name: d.room for d in demands if d.name in pooling and d.room > 0})
        return allotted

    def _batch_room(self, warm_models: int) -> int:
        """Batch lines this read may take in all: within `max_batch_jobs` (within
        `batch_jobs_beside_interactive` while interactive jobs run), and leaving a free slot for each
        warm model, so that an interactive job that arrives finds one at once."""
        running = len(self._jobs) - len(self._pooling_jobs)
        interactive = running - len(self._batch_jobs)
        bound = self._batch_jobs_beside if interactive > 0 else self._max_batch_jobs
        return max(0, min(bound - len(self._batch_jobs), self._max_jobs - running - warm_models))

    def _demand_of(self, slot: ModelSlot) -> shares.ModelDemand:
        """What the share policy needs to know of one warm model."""
        batch = slot.engine.max_sequences() if slot.engine is not None else None
        room = self._max_jobs if batch is None else batch
        return shares.ModelDemand(
            name=slot.name,
            running=slot.in_flight,
            room=max(0, room - slot.in_flight),
            weight=slot.model.weight,
            priority=slot.model.priority,
            hungry=slot.name in self._hungry,
        )

    def _reader_ended(self, task: asyncio.Task[None]) -> None:
        if self._stopping:
            return
        error = None if task.cancelled() else task.exception()
        logger.critical(
            "the loop that takes jobs has ended; this worker stops advertising itself and stops",
            exc_info=error,
            extra={"worker_id": self._worker_id},
        )
        self._on_failure()

    async def _sweep(self) -> None:
        """Put the jobs of dead workers back in line (every `takeover_check_s`).

        Only the streams of models with work are looked at: a job left pending keeps its stream
        from being empty, and so its model in the demand index.
        """
        running = {entry.entry_id for entry in self._entries.values()}
        noted = await self._demand.read()
        # The slots of adapters removed since are gone from `slots`: their streams are not taken over.
        self._by_stream = {
            stream: slot for stream, slot in self._by_stream.items() if slot.name in self._slots
        }
        streams = [stream for stream, slot in self._by_stream.items() if slot.name in noted]  # every tier
        await self._takeover.sweep(streams, running)

    async def _read_allotted(self, takes: dict[str, reads.Take], *, held_back: bool, at_batch: bool) -> None:
        """Read the allotted streams: without blocking first if one of their models may have jobs
        waiting, then (nothing taken) blocking, until a slot frees while a model with jobs waiting
        takes none."""
        in_turn = held_back and not self._fair  # one pool: the held-back model's turn is the next pass
        try:
            # Batch lines are taken only by this read, which takes a model's tiers in order and
            # within their caps; a blocking read waits for interactive jobs alone.
            if in_turn or any(name in self._hungry or take.batch > 0 for name, take in takes.items()):
                read = await reads.read_each(self._redis, self._take_in_order, self._worker_id, takes)
                if await self._take_read(read, takes) > 0 or in_turn:
                    return
            least = min(take.count for take in takes.values())
            counts = {stream: least for take in takes.values() for stream in take.streams[:-1]}
            if held_back or at_batch or self._batch_waiting or self._adapters_may_arrive():
                read = await self._held_back_read.read(self._worker_id, counts, BLOCK_MS)
            else:
                read = await reads.read_blocking(self._redis, self._worker_id, counts, BLOCK_MS)
            await self._take_read(read, takes)
        except ResponseError:
            raise
        except (ConnectionError, OSError, aioredis.RedisError):
            logger.exception("reading jobs failed; retrying")
            await asyncio.sleep(RETRY_DELAY_S)

    async def _take_read(self, read: reads.ReadResult, takes: dict[str, reads.Take]) -> int:
        """Start the jobs of one read, note which models came back full of interactive jobs; returns
        the entries taken. Entries beyond a model's allotment (a blocking read over its tiers) go
        back in line."""
        shadows: list[Entry] = []
        taken = 0
        if any(take.batch > 0 for take in takes.values()):
            self._batch_waiting = any(
                take.batch > 0 and read.count(take.streams[-1]) >= take.batch for take in takes.values()
            )
        for name, take in takes.items():
            interactive = sum(read.count(stream) for stream in take.streams[:-1])
            if interactive >= take.count:
                self._hungry.add(name)
            else:
                self._hungry.discard(name)
            ordered = _in_tier_order(read, take)
            for stream, entry_id, fields in ordered[take.count :]:
                self._start(self._hand_back_raw(stream, entry_id, fields))
            for stream, entry_id, fields in ordered[: take.count]:
                taken += 1
                shadow = self._take(stream, entry_id, fields)
                if shadow is not None:
                    shadows.append(shadow)
        if shadows:
            # A model that came back full, or one held back, may still have real jobs waiting.
            self._take_shadows(shadows, crowded=bool(self._hungry))
        if read.without_group:
            await self._ensure_groups(read.without_group)  # the stream expired or Redis restarted empty
        return taken

    # --- one job --------------------------------------------------------------------------------

    def _take(self, stream: str, entry_id: bytes, fields: dict[bytes, bytes]) -> Entry | None:
        """Start a task for one entry read; its lease is taken here, before the task starts. A shadow
        copy is returned instead, to be judged once the whole read is taken (`_take_shadows`)."""
        try:
            entry = decode_entry(stream, entry_id, fields)
        except (KeyError, msgspec.DecodeError) as exc:
            reason = f"the entry cannot be decoded as a job: {exc!r}"
            self._start(self._bury(stream, entry_id, fields, reason))
            return None
        if entry.job.shadow:
            return entry
        self._run(entry)
        return None

    def _take_shadows(self, entries: list[Entry], *, crowded: bool) -> None:
        """Run the shadow copies of one read that find a slot to spare; drop the others."""
        for entry in entries:
            spare = (
                not crowded
                and len(self._shadow_jobs) < self._max_shadow_jobs
                and len(self._jobs) < self._max_jobs
            )
            if not spare:
                self._start(self._runner.fail(entry, SHADOW_DROPPED, create=True))
                continue
            task = self._run(entry)
            self._shadow_jobs.add(task)
            task.add_done_callback(self._shadow_jobs.discard)

    def _run(self, entry: Entry) -> asyncio.Task[None]:
        """Start running `entry`'s job on its model's slot (or hand it back if the slot cannot serve)."""
        try:
            slot = self._by_stream[entry.stream]
            lease = slot.lease(batch=entry.job.tier == "batch")
        except SlotNotServing:
            # Cannot happen after the read barrier; if it ever does, the job goes back in line.
            return self._start(self._hand_back(entry))
        SLOT_WAIT.labels(slot.name).observe(slot.waited_while_warm(entry.job.created))
        task = self._start(self._runner.run(entry, slot, lease), entry)
        if slot.model.pooling:
            self._pooling_jobs.add(task)
        if entry.job.tier == "batch":
            self._batch_jobs.add(task)
        return task

    def _start(self, work: Coroutine[Any, Any, None], entry: Entry | None = None) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._jobs.add(task)
        if entry is not None:
            self._entries[task] = entry
        task.add_done_callback(self._job_done)
        return task

    def _adapters_may_arrive(self) -> bool:
        """Whether a warm model here takes adapters (which become warm in milliseconds): waking its
        reads costs a round trip per read (the connection's client id), paid only then."""
        return any(slot.model.lora is not None for slot in self._slots.warm())

    def _slot_changed(self, slot: ModelSlot) -> None:
        # A slot made since the start (an adapter registered at run time) is known from its first change.
        for stream in keys.job_streams(slot.name, TIERS):
            self._by_stream[stream] = slot
        # A model that becomes warm has its jobs read at once; one that stops taking jobs waits for
        # the read under way (its read barrier) before it leaves: an adapter evicted to make room
        # for another waited out a whole blocking read (250 ms) before the other could load.
        if slot.state in ("warm", "unloading", "sleeping"):
            self._held_back_read.wake()

    def _job_done(self, task: asyncio.Task[None]) -> None:
        self._jobs.discard(task)
        self._pooling_jobs.discard(task)
        self._batch_jobs.discard(task)
        self._entries.pop(task, None)
        self._slot_freed.set()
        self._held_back_read.wake()

    async def _decoded(self, stream: str, entry_id: bytes, fields: dict[bytes, bytes]) -> Entry | None:
        try:
            return decode_entry(stream, entry_id, fields)
        except (KeyError, msgspec.DecodeError) as exc:
            await self._bury(stream, entry_id, fields, f"the entry cannot be decoded as a job: {exc!r}")
            return None

    async def _bury(self, stream: str, entry_id: bytes, fields: dict[bytes, bytes], reason: str) -> None:
        try:
            await dead_letter(self._redis, stream, entry_id, fields, reason=reason, worker_id=self._worker_id)
        except Exception:
            logger.exception("could not move an entry to the dead-letter stream", extra={"stream": stream})

    async def _hand_back_raw(self, stream: str, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        """Put back in line an entry read beyond its model's allotment."""
        entry = await self._decoded(stream, entry_id, fields)
        if entry is not None:
            await self._hand_back(entry)

    async def _hand_back(self, entry: Entry) -> None:
        """Put a job this worker could not run or finish back in line; it does not count as a failure."""
        try:
            if await self._takeover.requeue(entry.stream, entry.entry_id, entry.payload, entry.taken_before):
                logger.warning("job handed back", extra={"job_id": entry.job.id})
        except Exception:
            # Left pending, it is taken over once this worker's record has expired.
            logger.exception("could not hand a job back", extra={"job_id": entry.job.id})


def batch_shares(
    demands: list[shares.ModelDemand], allotted: dict[str, int], batch: int, turn: int = 0
) -> dict[str, int]:
    """Batch lines each allotted model may take on this read: within its allotment, never its
    engine's last sequence (an interactive job that arrives finds room), `batch` in all, split evenly
    among the models that may take any (the remainder to each in turn), so that no model's lines
    wait behind another's."""
    takers = [d for d in demands if min(allotted.get(d.name, 0), d.room - 1) > 0]
    if not takers or batch <= 0:
        return {}
    start = turn % len(takers)
    takers = takers[start:] + takers[:start]
    out = {}
    for left, demand in enumerate(takers):
        even = -(-batch // (len(takers) - left))  # what is left, split over the models left
        share = min(allotted[demand.name], demand.room - 1, even)
        if share > 0:
            out[demand.name] = share
            batch -= share
    return out


def _in_tier_order(read: reads.ReadResult, take: reads.Take) -> list[tuple[str, bytes, dict[bytes, bytes]]]:
    """The entries one read gave of one model, its tiers in order."""
    return [
        (stream, entry_id, fields)
        for stream in take.streams
        for entry_id, fields in read.entries.get(stream, ())
    ]
