"""Which worker of a test's stack runs a job: the one to kill when a test takes a job over."""

from __future__ import annotations

import redis

from switchboard import keys
from switchboard.local.launcher import Component
from switchboard.wire import worker_decoder
from tests.support.stack import Stack


def running_worker(stack: Stack, model: str) -> Component | None:
    """The worker process that runs the newest job pending on `model`'s stream (the test's, where
    earlier tests' jobs have ended), once it has taken it."""
    with redis.Redis.from_url(stack.redis_url) as client:
        pending = client.xpending_range(keys.job_stream(model), keys.JOB_GROUP, "-", "+", 1000)
        if not pending:
            return None
        record = client.get(keys.worker_record(pending[-1]["consumer"].decode()))
    if record is None:
        return None
    pid = worker_decoder.decode(record).pid
    return next((w for w in stack.workers if w.process.pid == pid), None)
