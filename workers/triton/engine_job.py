"""A job as the consumer hands it to its Triton model, a generator's or a pooling model's: a Job, or
a taken-over Job to continue.

Shared by the consumer (`workers.jobs.run` encodes it) and both kinds of Triton model, which decode
it (`workers.triton.generator.model`, `workers.triton.pooling.client`).
"""

from __future__ import annotations

import msgspec

from switchboard.wire import Job


class EngineJob(Job, frozen=True, kw_only=True, omit_defaults=True):
    """A job as the consumer hands it to its Triton model: a Job, or a taken-over Job to continue.

    Never crosses Redis: the consumer adds `continuation` (the text the client already has, from
    the result stream) to a job whose worker died, for its one choice to go on from there.
    """

    continuation: str | None = None


engine_job_decoder = msgspec.msgpack.Decoder(EngineJob)
