"""Where a job stands when a worker takes it: not wanted any more, untouched, or half answered.

The front door reads a job's result stream from its start, so that stream holds every chunk the
client was sent. A job that another worker took before (and died or stopped running) is continued from
there: its one choice goes on after the text already sent, appended to the same stream, so the
client sees one seamless answer. Jobs whose output cannot be continued that way (several choices,
echo, log probabilities, parsed tool calls, constrained output) end with a clear error instead.
"""

from __future__ import annotations

from typing import Literal

import msgspec
import redis.asyncio as aioredis

from switchboard import keys, lua
from switchboard.lua.batched import ScriptBatch
from switchboard.wire import Job, JobError, chunk_decoder

_CHUNK = keys.CHUNK_FIELD.encode()


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """What to do with a job just taken.

    skip: nobody waits for it (a cancel mark), or its last chunk was already sent: acknowledge it.
    run: run it from the start. continue_: run it on after `continuation`. refuse: end it with `error`.
    """

    action: Literal["skip", "run", "continue_", "refuse"]
    continuation: str = ""
    # How many chunks its result stream holds already: the position of the next one.
    sent: int = 0
    error: JobError | None = None


async def plan(redis: aioredis.Redis, job: Job) -> Plan:
    """Read where a job put back in line stands (one round trip) and say how to go on: a worker
    died or stopped running it, so part of its answer may have been sent already. (A fresh job
    is run at once; whether its client left is asked meanwhile, `LeftChecks`.)
    """
    pipe = redis.pipeline(transaction=False)
    pipe.exists(keys.cancel_mark(job.id))
    pipe.xrange(keys.result_stream(job.id))
    cancelled, entries = await pipe.execute()
    if cancelled:
        return Plan(action="skip")
    chunks = [chunk_decoder.decode(fields[_CHUNK]) for _, fields in entries]
    if any(chunk.is_last for chunk in chunks):
        return Plan(action="skip")
    if not chunks:
        return Plan(action="run")
    why_not = why_not_continuable(job)
    if why_not is not None:
        message = (
            f"The worker running job {job.id} stopped after part of the answer was sent, and another "
            f"worker cannot continue it: {why_not}. Retry the request."
        )
        return Plan(action="refuse", error=JobError(code="engine_error", message=message), sent=len(chunks))
    continuation = "".join(chunk.text for chunk in chunks if chunk.index == 0)
    return Plan(action="continue_", continuation=continuation, sent=len(chunks))


class LeftChecks:
    """Whether the clients of jobs just sent to the engine have left (their cancel marks are set).

    Asked for every fresh job: one command each, a burst of jobs read together took a connection
    each from the pool (14 more at 32 streams) and a round trip each, all while the burst's first
    tokens were on their way. Here the checks of jobs started together share one.
    """

    def __init__(self, redis: aioredis.Redis) -> None:
        self._batch = ScriptBatch(redis)
        self._script = lua.register(redis, "client_left")

    async def client_left(self, job_id: str) -> bool:
        """Whether the job's client has left."""
        return bool(await self._batch.run(self._script, [keys.cancel_mark(job_id)], []))


def why_not_continuable(job: Job) -> str | None:
    """Why another worker cannot go on with the job's partial output (None: it can)."""
    sampling = job.sampling
    if job.prompts is not None and len(job.prompts) > 1:
        return "it has several prompts"
    if sampling.n > 1:
        return "it asks for several choices (n > 1)"
    if sampling.echo:
        return "it echoes its prompt"
    if sampling.logprobs is not None:
        return "it asks for log probabilities"
    if job.parse_tool_calls:
        return "the model's tool calls are parsed from its text"
    if sampling.structured is not None:
        return "its output is constrained (response_format or structured outputs)"
    return None
