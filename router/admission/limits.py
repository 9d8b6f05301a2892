"""Admission: a request is queued only within its key's limits and the deployment's bounds.

One Lua script (`switchboard/lua/admit.lua`) decides and commits in one round trip, on Redis's
clock (`TIME`), so that every front door sharing the Redis shares the limits and replicas with
skewed clocks agree:

- per key, requests and tokens per minute as token buckets (each holds a minute's worth and
  refills continuously). Tokens are reserved at admission from an estimate (prompt characters / 4,
  plus max_tokens or `limits.estimated_completion_tokens`) and settled with the job's real usage
  when it ends, so a key pays for what it used;
- per key, requests in flight, as a sorted set of job ids scored by when each slot expires: a
  front door that dies without releasing its slots loses them past the job's deadline;
- across the front doors, requests in flight (`limits.max_in_flight`), the same way;
- per model, jobs waiting on its stream that no worker has taken (`limits.max_queue_depth`);
- per key and per team, tokens per UTC day and month (`router.admission.quotas`): the estimate is
  reserved on the counters of the key and its team, and settled with the real usage at release.

A key's limits are kept under its identity (`Caller.owner`, the SHA-256 of its secret: 64 hex
digits), never its name: renaming a key in the config keeps its budget, and no key shares another's
or the keyless caller's (which has no limits, so nothing is kept for it).

A refusal is a 429 with Retry-After (from the bucket for rate limits) and commits nothing.
`Ticket.release` gives the slots back and settles the tokens; `JobRun.close` calls it on every
path a job ends by.

A client resuming a stream (`Last-Event-ID`) is admitted the same way (`admit_resume`): it takes a
request, an in-flight slot of its own (each reader of one job holds one) and tokens, or is refused
before anything of the job is read. Only the queue bound does not apply: nothing is queued. It
reserves what the job's answer was estimated at when it was queued (kept in the job's record), not
what the request it re-sends asks for. What it is charged is `router.admission.charges`' rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Coroutine
from typing import Any

import redis.asyncio as aioredis

from router.admission.auth import Caller
from router.admission.quotas import QUOTA_REFUSALS, QuotaHold
from router.openai.errors import TooManyRequestsError
from switchboard import keys, lua
from switchboard.config import LimitsConfig
from switchboard.lua.batched import ScriptBatch
from switchboard.wire import Job, PoolingTask, Prompt

logger = logging.getLogger(__name__)

# Retry-After for bounds that free up as requests end, not at a known rate.
BUSY_RETRY_S = 1.0


def estimate_tokens(job: Job, completion_tokens: int) -> int:
    """Tokens a job will likely use: each prompt's characters / 4 (or its token ids), plus max_tokens or
    `completion_tokens` for each choice."""
    prompt_tokens = math.ceil(sum(len(m.content or "") for m in job.messages or ()) / 4)
    for prompt in job.prompts or ():
        prompt_tokens += _prompt_tokens(prompt)
    if job.pooling is not None:
        return pooling_input_tokens(job.pooling)
    return prompt_tokens + estimate_completion_tokens(job, completion_tokens)


def pooling_input_tokens(task: PoolingTask) -> int:
    """Tokens a pooling job's inputs will likely hold (it generates none): a reranker reads the
    query once beside each document, as the engine sees the pairs."""
    query = _prompt_tokens(task.query) if task.query is not None else 0
    return sum(_prompt_tokens(prompt) + query for prompt in task.inputs)


def _prompt_tokens(prompt: Prompt) -> int:
    return math.ceil(len(prompt) / 4) if isinstance(prompt, str) else len(prompt)


def estimate_completion_tokens(job: Job, completion_tokens: int) -> int:
    """Tokens a job's answer will likely hold: max_tokens or `completion_tokens` for each choice
    (none for a pooling job)."""
    if job.pooling is not None:
        return 0
    choices = job.sampling.n * len(job.prompts or (None,))
    return choices * (job.sampling.max_tokens or completion_tokens)


class Ticket:
    """An admitted request's hold on the limits; `release` gives it back (idempotent).

    `slot` names its in-flight slots: the job's id for a queued job, one of its own for each client
    resuming the job's stream. `quota`: the token counters it reserved on (None: none).
    """

    def __init__(
        self,
        admission: Admission,
        slot: str,
        caller: Caller,
        reserved_tokens: int,
        quota: QuotaHold | None = None,
    ) -> None:
        self._admission = admission
        self.slot = slot
        self.caller = caller
        self.reserved_tokens = reserved_tokens
        self.quota = quota
        self._released = False

    @property
    def answer_waits_for_release(self) -> bool:
        """Whether the request's answer must wait until its slots are given back: a key limited to
        some requests at a time sends its next one the moment it has this answer, and that one must
        find this one's slot free, at whichever front door it lands. Tokens per minute and the
        servers' overall cap are budgets that a release a few milliseconds late does not break."""
        return self.caller.max_parallel is not None

    async def release(self, used_tokens: int | None) -> None:
        """Free the request's slots and settle its tokens with `used_tokens` (None: keep the estimate)."""
        if self._released:
            return
        self._released = True
        await self._admission.release(self, self._refund(used_tokens))

    def release_soon(self, used_tokens: int | None) -> None:
        """`release`, sent with the front door's next batch of releases without waiting for Redis's
        reply (a failure is logged; the slots then expire past the job's deadline)."""
        if self._released:
            return
        self._released = True
        self._admission.release_soon(self, self._refund(used_tokens))

    def _refund(self, used_tokens: int | None) -> int:
        return 0 if used_tokens is None else self.reserved_tokens - used_tokens

    def given_back(self) -> None:
        """Its slots are free already (the script that took them gave them back): `release` sends nothing."""
        self._released = True


class Admitting:
    """A job on its way through admission and into its queue in one call: admit_enqueue.lua's KEYS
    and ARGV of its admission (admit.lua's, and the answer's estimate for the job's record), and the
    ticket the job holds once admitted."""

    def __init__(
        self,
        admission: Admission,
        job: Job,
        caller: Caller,
        tokens: int,
        quota: QuotaHold,
        script_keys: list[str],
        args: list[str | int],
    ) -> None:
        self._admission = admission
        self._job = job
        self.keys = script_keys
        self.args = args
        self.ticket = Ticket(admission, job.id, caller, tokens, quota)

    def refused(self, refusal: list[bytes]) -> TooManyRequestsError:
        """The 429 for the script's refusal `[what, retry after (s), detail]`; the job holds nothing."""
        self.ticket.given_back()
        ticket = self.ticket
        return self._admission.refusal(
            refusal, self._job, ticket.caller, ticket.reserved_tokens, ticket.quota
        )


class Admission:
    """Admits requests against the limits shared through Redis."""

    def __init__(self, redis: aioredis.Redis, limits: LimitsConfig) -> None:
        self._limits = limits
        # Registered once: later calls send only the scripts' hashes (EVALSHA).
        self._admit_script = lua.register(redis, "admit")
        self._admit_resume_script = lua.register(redis, "admit_resume")
        self._release_script = lua.register(redis, "release")
        # Every request that ends releases its slots: the calls of requests ending together go to
        # Redis together (a batch of pooled answers ends at once).
        self._releases = ScriptBatch(redis)

    async def admit(self, job: Job, caller: Caller) -> Ticket:
        """A ticket for queueing `job`, or a 429 saying which limit it met and when to retry."""
        tokens = self._estimate(job, caller)
        return await _given_back_if_cancelled(self._admit(job, caller, tokens))

    async def admit_resume(self, job: Job, caller: Caller) -> Ticket:
        """A ticket for one more reader of `job`'s stream (resumed with `Last-Event-ID`), or a 429.

        It reserves the tokens of the job's answer as estimated when the job was queued, which its
        record keeps (`admit_resume.lua`), whatever the request the client re-sent asks for: a resume
        costs the same with `max_tokens` lowered or raised (`charges.DeliveredShare` settles it with
        what it delivers). It holds a slot of its own, so that each reader counts in flight.
        """
        return await _given_back_if_cancelled(self._admit_resume(job, caller))

    async def _admit(self, job: Job, caller: Caller, tokens: int) -> Ticket:
        quota = QuotaHold.of(caller, time.time())
        script_keys, args = self._script_call(job, caller, job.id, tokens, None, quota)
        refusal = await self._admit_script(keys=script_keys, args=args)
        if refusal is not None:
            raise self.refusal(refusal, job, caller, tokens, quota)
        return Ticket(self, job.id, caller, tokens, quota)

    async def _admit_resume(self, job: Job, caller: Caller) -> Ticket:
        # Reserved only where the record keeps no estimate of this key's job: an unknown job or
        # another key's (refused next, and all of it given back), or one queued before records kept it.
        without_record = (
            estimate_completion_tokens(job, self._limits.estimated_completion_tokens)
            if caller.counts_tokens
            else 0
        )
        slot = f"{job.id}:resume:{uuid.uuid4().hex[:12]}"
        quota = QuotaHold.of(caller, time.time())
        script_keys, args = self._script_call(job, caller, slot, without_record, -1, quota)
        reply = await self._admit_resume_script(
            keys=[*script_keys, keys.job_record(job.id)], args=[*args, caller.owner]
        )
        if reply[0] == b"refused":
            raise self.refusal(reply[1:4], job, caller, int(reply[4]), quota)
        return Ticket(self, slot, caller, int(reply[1]), quota)

    def admitting(self, job: Job, caller: Caller) -> Admitting:
        """What admitting `job` sends, for a script that admits and queues it in one round trip
        (`JobQueue.send_admitted`, `switchboard/lua/admit_enqueue.lua`); nothing is sent here.
        Its answer's estimate goes with it, for its record: what a resume of its stream reserves."""
        tokens = self._estimate(job, caller)
        quota = QuotaHold.of(caller, time.time())
        script_keys, args = self._script_call(job, caller, job.id, tokens, None, quota)
        args.append(estimate_completion_tokens(job, self._limits.estimated_completion_tokens))
        return Admitting(self, job, caller, tokens, quota, script_keys, args)

    def _estimate(self, job: Job, caller: Caller) -> int:
        """The tokens `job` reserves: its estimate where its key counts tokens (tpm, a quota's
        counters), else none."""
        return estimate_tokens(job, self._limits.estimated_completion_tokens) if caller.counts_tokens else 0

    def _script_call(
        self,
        job: Job,
        caller: Caller,
        slot: str,
        tokens: int,
        max_queue_depth: int | None,
        quota: QuotaHold,
    ) -> tuple[list[str], list[str | int]]:
        """admit.lua's KEYS and ARGV."""
        slot_ttl_ms = math.ceil((job.deadline - time.time() + keys.SLOT_GRACE_S) * 1000)
        script_keys = [
            keys.key_rate(caller.owner),
            keys.key_in_flight(caller.owner),
            keys.in_flight(),
            keys.job_stream(job.model, job.tier),
        ]
        args: list[str | int] = [
            slot,
            max(slot_ttl_ms, 1000),
            caller.rpm or 0,
            caller.tpm or 0,
            tokens,
            caller.max_parallel or 0,
            self._limits.max_in_flight,
            self._queue_bound(job) if max_queue_depth is None else max_queue_depth,
            keys.JOB_GROUP,
        ]
        return [*script_keys, *quota.admit_keys()], [*args, *quota.admit_args()]

    def _queue_bound(self, job: Job) -> int:
        """The bound on the jobs waiting in `job`'s line: a batch's lines are bounded by its runner
        (`batches.max_lines_in_flight`) and wait in their own stream, where they hold no one up."""
        return -1 if job.tier == "batch" else self._limits.max_queue_depth

    def refusal(
        self, refusal: list[bytes], job: Job, caller: Caller, tokens: int, quota: QuotaHold | None
    ) -> TooManyRequestsError:
        """The 429 for admit.lua's refusal `[what, retry after (s), detail]`."""
        what, retry_after_s, detail = (part.decode() for part in refusal)
        if what in QUOTA_REFUSALS and quota is not None:
            logger.debug("request refused for its quota", extra={"key": caller.name, "quota": what})
            return quota.refused(what, float(retry_after_s), int(detail), caller, tokens)
        return self._refused(what, float(retry_after_s), int(detail), job, caller, tokens)

    async def release(self, ticket: Ticket, refund_tokens: int) -> None:
        """Give a ticket's slots back and its unused tokens (`Ticket.release` calls this)."""
        await self._releases.run(self._release_script, *self._release_call(ticket, refund_tokens))

    def release_soon(self, ticket: Ticket, refund_tokens: int) -> None:
        """`release` without waiting for it (`Ticket.release_soon` calls this)."""
        reply = self._releases.submit(self._release_script, *self._release_call(ticket, refund_tokens))
        reply.add_done_callback(_log_failed_release)

    async def drain(self, timeout_s: float) -> None:
        """Wait, up to `timeout_s`, for the releases sent without waiting to be done (as the front
        door stops: its Redis connections close next)."""
        await self._releases.drain(timeout_s)

    def _release_call(self, ticket: Ticket, refund_tokens: int) -> tuple[list[str], list[str | int]]:
        owner = ticket.caller.owner
        settled = ticket.quota.settled() if ticket.quota is not None else []
        return (
            [keys.key_rate(owner), keys.key_in_flight(owner), keys.in_flight(), *settled],
            [ticket.slot, refund_tokens, ticket.caller.tpm or 0],
        )

    def _refused(
        self, what: str, retry_after_s: float, detail: int, job: Job, caller: Caller, tokens: int
    ) -> TooManyRequestsError:
        logger.debug(
            "request refused at admission",
            extra={"key": caller.name, "model": job.model, "limit": what, "retry_after_s": retry_after_s},
        )
        if what == "rpm":
            message = (
                f"Rate limit reached for key `{caller.name}` on requests per minute (limit {caller.rpm})."
            )
            return TooManyRequestsError(message, retry_after_s=retry_after_s)
        if what == "tpm":
            message = (
                f"Rate limit reached for key `{caller.name}` on tokens per minute (limit {caller.tpm}, "
                f"{detail} left, this request counts about {tokens})."
            )
            return TooManyRequestsError(message, retry_after_s=retry_after_s, tokens=True)
        if what == "parallel":
            message = f"Key `{caller.name}` already has {detail} requests in flight, its limit."
            return TooManyRequestsError(message, retry_after_s=BUSY_RETRY_S)
        if what == "in_flight":
            message = f"The server has {detail} requests in flight, its limit (limits.max_in_flight)."
            return TooManyRequestsError(message, retry_after_s=BUSY_RETRY_S, code="server_busy")
        message = f"The queue of model `{job.model}` is full: {detail} jobs wait (limits.max_queue_depth)."
        return TooManyRequestsError(message, retry_after_s=BUSY_RETRY_S, code="queue_full")


async def _given_back_if_cancelled(admitting: Coroutine[Any, Any, Ticket]) -> Ticket:
    """The ticket `admitting` gets; a caller cancelled meanwhile (its client left) holds nothing:
    what the script took is given back."""
    admitted = asyncio.ensure_future(admitting)
    try:
        return await asyncio.shield(admitted)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await (await admitted).release(0)
        raise


def _log_failed_release(reply: asyncio.Future[object]) -> None:
    if reply.cancelled():
        return
    if (error := reply.exception()) is not None:
        # Its slots expire on their own past the job's deadline.
        logger.warning("could not release a request's admission slots", extra={"error": str(error)})
