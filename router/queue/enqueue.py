"""Put a job on its model's stream in one round trip (`switchboard/lua/enqueue.lua`, which also notes
the model in the demand index), and count the readers of its results (`resume.lua`, and a reader
that leaves, `step_away.lua`), giving up a job whose streamed client did not come back (`give_up.lua`).

A job belongs to the key that sent it, by the key's identity (`Caller.owner`, the SHA-256 of its
secret): its record's `tenant`. Only that key may resume its stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from router.admission.limits import Admitting
from switchboard import keys, lua
from switchboard.cancel_marks import CancelMarks
from switchboard.lua.batched import ScriptBatch
from switchboard.tasks import TaskSet
from switchboard.wire import Chunk, Job, LoadFailure, chunk_decoder, encode, load_failure_decoder

logger = logging.getLogger(__name__)


class Resumption(msgspec.Struct, frozen=True, kw_only=True):
    """A job's stream as a client resuming it finds it."""

    earlier: list[Chunk]  # the chunks the client had already
    model: str | None  # the model the job is queued for (None for a record older than the field)


class UnknownEntry(Exception):
    """A resumed stream names no entry of its job's results: no event ever carried that id."""


def _field(fields: list[bytes], name: bytes) -> bytes:
    """A field of a stream entry as a script returns it (a flat list of names and values)."""
    return fields[fields.index(name) + 1]


def admitted(reply: Any, admitting: Admitting) -> LoadFailure | None:
    """What `admit_enqueue.lua` answered: None (queued), the model's failure (its slots given back),
    or a 429 raised when admission refused the job."""
    if reply is None:
        return None
    outcome = reply[0].decode()
    if outcome == "refused":
        raise admitting.refused(reply[1:])
    admitting.ticket.given_back()
    return load_failure_decoder.decode(reply[1])


class JobQueue:
    """The front door's side of the job streams."""

    def __init__(self, redis: aioredis.Redis, tasks: TaskSet) -> None:
        self._redis = redis
        self._tasks = tasks
        # Registered once: later calls send only the script's hash (EVALSHA), loading it on a miss.
        self._enqueue = lua.register(redis, "enqueue")
        self._admit_enqueue = lua.register(redis, "admit_enqueue")
        # Every request is admitted and queued by this script: the calls of concurrent requests go
        # to Redis together.
        self._admissions = ScriptBatch(redis)
        self._resume = lua.register(redis, "resume")
        self._give_up = lua.register(redis, "give_up")
        self._step_away = lua.register(redis, "step_away")
        self._cancel_marks = CancelMarks(redis)

    async def submit(self, job: Job, *, owner: str, moved: bool = False) -> LoadFailure | None:
        """Append the job to its model's stream, unless the model's last load failed: then its failure.

        Its record (`keys.job_record`) is written, naming `owner` (the identity of the key that sent
        it, `Caller.owner`), its model noted in the demand index, and the
        demand stream poked, in the same round trip. Submitting a job
        again queues nothing. A `moved` job (`router.queue.move_waiting`) keeps its record, now naming its
        new model.
        """
        script_keys, args = _submit_call(job, owner, moved=moved)
        failure = await self._enqueue(keys=script_keys, args=args)
        return None if failure is None else load_failure_decoder.decode(failure)

    def send_admitted(self, job: Job, admitting: Admitting, *, owner: str) -> asyncio.Future[Any]:
        """`submit`, admitting the job first in the same round trip (`admit_enqueue.lua`), sent with
        the next batch of admissions: its reply, to come, for `admitted` (awaited with
        `switchboard.lua.batched.answer`). Awaited in the caller's own task, the reply wakes it in one
        turn of the loop."""
        script_keys, args = _submit_call(job, owner, moved=False)
        return self._admissions.submit(
            self._admit_enqueue, [*admitting.keys, *script_keys], [*admitting.args, *args]
        )

    async def resume(self, job_id: str, after: str, *, owner: str) -> Resumption | None:
        """Count one more reader of `job_id`'s results, for the key `owner`; the chunks up to entry
        `after` (a valid stream id). None, counting nobody, when its results are not kept (an
        unknown job, or one whose results were deleted or expired) or the job is another key's;
        UnknownEntry when `after` is no entry of its results."""
        found = await self._resume(
            keys=[keys.job_record(job_id), keys.result_stream(job_id)],
            args=[keys.RESULT_TTL_S, after, owner],
        )
        outcome = found[0].decode()
        if outcome == "gone":
            return None
        if outcome == "unknown_entry":
            raise UnknownEntry(after)
        chunk_field = keys.CHUNK_FIELD.encode()
        model = found[2].decode() if len(found) > 2 and found[2] else None
        return Resumption(
            earlier=[chunk_decoder.decode(_field(fields, chunk_field)) for _, fields in found[1]], model=model
        )

    async def load_claimed(self, model: str) -> bool:
        """Whether a worker has claimed the first replica of `model` (its lease): it is starting a
        load that its heartbeat may not tell yet, for a model nobody holds."""
        return bool(await self._redis.exists(keys.replica_lease(model, 0)))

    async def cancel(self, job_id: str) -> None:
        """Leave a cancel mark (unless the job ended): the worker running it stops generating for it."""
        await self._cancel_marks.leave(job_id)

    async def leave(self, job_id: str) -> None:
        """A job whose reader left before its end, and which nobody may resume: its cancel mark, and
        its result stream and record deleted."""
        pipe = self._redis.pipeline(transaction=False)
        await self._cancel_marks.leave(job_id, client=pipe)
        pipe.unlink(keys.result_stream(job_id), keys.job_record(job_id))
        await pipe.execute()

    async def step_away(self, job_id: str) -> int:
        """A streamed reader that left mid-stream, whose client may resume it: counted out of the job's
        readers, its results kept until they expire (or the job is given up). Returns the job's
        leaves so far, which `give_up` compares to tell whether another reader left since. A record
        that is gone is not written again (a lost job must not look alive): 0 leaves."""
        leaves = await self._step_away(
            keys=[keys.job_record(job_id), keys.result_stream(job_id)], args=[keys.RESULT_TTL_S]
        )
        return int(leaves)

    async def give_up(self, job_id: str, *, leaves: int) -> bool:
        """Cancel the job and delete its results and record at once, unless a reader is back or one
        left after the `leaves`th (its own grace runs); whether it was given up."""
        given_up = await self._give_up(
            keys=[keys.job_record(job_id), keys.result_stream(job_id), keys.cancel_mark(job_id)],
            args=[leaves, keys.CANCEL_TTL_S],
        )
        return bool(given_up)

    def give_up_later(self, job_id: str, *, leaves: int, after_s: float) -> None:
        """`give_up` after `after_s`, the resume grace, if no client is reading the job's results by then
        (it resumed the stream, through this front door or another). A give-up still waiting when the
        front door stops is dropped with its task set: its job runs on to its end and its results
        expire, since a front door stops mostly to be replaced, and its clients then resume through
        another one."""
        self._tasks.start(self._give_up_later(job_id, leaves, after_s), "give up after the resume grace")

    async def _give_up_later(self, job_id: str, leaves: int, after_s: float) -> None:
        await asyncio.sleep(after_s)
        try:
            await self.give_up(job_id, leaves=leaves)
        except RedisError:
            logger.warning("could not give up a job nobody reads", extra={"job_id": job_id})


def _submit_call(job: Job, owner: str, *, moved: bool) -> tuple[list[str], list[bytes | str | int]]:
    """enqueue.lua's KEYS and ARGV for `job` (`JobQueue.submit`)."""
    script_keys = [
        keys.load_failure(job.model),
        keys.job_stream(job.model, job.tier),
        keys.job_record(job.id),
        keys.demand_index(),
        keys.demand_stream(),
    ]
    args: list[bytes | str | int] = [
        encode(job),
        keys.JOB_STREAM_TTL_S,
        job.model,
        job.id,
        keys.DEMAND_INDEX_TTL_S,
        keys.DEMAND_MAXLEN,
        keys.DEMAND_TTL_S,
        owner,
        record_ttl_s(job),
    ]
    if moved:
        args.append("moved")
    return script_keys, args


def record_ttl_s(job: Job) -> int:
    """How long a job's record lives: until its results expire after its deadline."""
    return max(1, int(job.deadline - time.time()) + keys.RESULT_TTL_S)
