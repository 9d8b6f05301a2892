"""One job at the front door, observed: its spans and its timings, fed by the job's own steps.

The pipeline makes one per job it queues. Tracing on, it opens the GenAI span of the job (`chat
{model}`) under the request's HTTP span, times admission and enqueue as its children, and hands the
job a W3C carrier (`Job.trace`) naming that span, so the worker's spans join the same trace. Each
chunk the request takes passes `chunk()`: the first ends the wait (`switchboard.await_first_chunk`)
and starts the relay (`switchboard.relay`), which lasts until the job is closed. Metrics (time to
first token, per output token, tokens, finish reasons) are recorded whether tracing is on or not,
and so is what a running rollout of the job's route judges (`router.telemetry.rollout_observations`).
"""

from __future__ import annotations

import sys
import time
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import msgspec

from router.openai.errors import OpenAIError
from router.telemetry.front_door_metrics import (
    GENERATION_TOKENS,
    PROMPT_TOKENS,
    REQUEST_SUCCESS,
    TIME_PER_OUTPUT_TOKEN,
    TIME_TO_FIRST_TOKEN,
)
from router.telemetry.requests import current_request
from router.telemetry.rollout_observations import FAILURE_CODES, Observations
from switchboard import gen_ai, tracing
from switchboard.wire import Chunk, Job, Usage

_NO_SPAN: AbstractContextManager[None] = nullcontext()


class FrontDoorJobObserver:
    """The spans and timings of one job of a request (or of a resumed stream, `resumed`)."""

    def __init__(self, job: Job, observations: Observations, *, resumed: bool = False) -> None:
        self._observations = observations
        self.model = job.model
        self.route = job.route
        self._route_label = job.route or ""  # its metrics' `route` label (empty: not routed)
        self._deadline = job.deadline
        self._resumed = resumed
        request = current_request()
        if request is not None:
            request.model = job.model
            request.route = self._route_label
            request.job_id = job.id
            request.operation = gen_ai.operation(job)
            request.generated = not resumed
        self._arrived = request.started if request is not None else time.perf_counter()
        self._first: float | None = None
        self._last: float | None = None
        self._usage: Usage | None = None
        self._finish_reasons: list[str] = []
        self._error: str | None = None
        self._cold = False
        self._span: Any = None
        self._parent: Any = None
        self._waiting_since_ns = 0
        self._relay: Any = None
        self._closed = False
        if tracing.enabled():
            self._span = tracing.start_span(gen_ai.span_name(job), attributes=gen_ai.job_attributes(job))
            if resumed:
                self._span.set_attribute("switchboard.resumed", True)
            self._parent = tracing.context_with(self._span)
            self._waiting_since_ns = tracing.now_ns()

    def phase(self, name: str) -> AbstractContextManager[Any]:
        """A child span of the job around one step of starting it (admission, enqueue).

        A step that raises ends the job's span too: the job will not start. Tracing off, nothing.
        """
        if self._span is None:
            return _NO_SPAN
        return self._phase(name)

    @contextmanager
    def _phase(self, name: str) -> Any:
        step = tracing.start_span(name, parent=self._parent)
        try:
            yield step
        except BaseException as exc:
            from opentelemetry.trace import Status, StatusCode

            step.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            step.end()
            self._span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            self.closed(finished=False)
            raise
        step.end()
        self._waiting_since_ns = tracing.now_ns()

    def traced(self, job: Job) -> Job:
        """`job` carrying the trace context for the worker, stamped with when it was sent."""
        if self._span is None:
            return job
        carrier = tracing.carrier_of(self._span, **{tracing.ENQUEUED_KEY: str(tracing.now_ns())})
        return msgspec.structs.replace(job, trace=carrier)

    def chunk(self, chunk: Chunk) -> None:
        """The request took `chunk` of its job."""
        if self._first is None:
            self._first = time.perf_counter()
            self._cold = chunk.cold_start
            if not self._resumed:
                TIME_TO_FIRST_TOKEN.labels(self.model, self._route_label).observe(self._first - self._arrived)
            if self._span is not None:
                now = tracing.now_ns()
                tracing.record_span(
                    "switchboard.await_first_chunk", self._waiting_since_ns, now, parent=self._parent
                )
                self._relay = tracing.start_span("switchboard.relay", parent=self._parent, start_ns=now)
        if chunk.finish_reason is not None:
            self._finish_reasons.append(chunk.finish_reason)
        if chunk.error is not None:
            self._error = chunk.error.code
        if chunk.is_last:
            self._last = time.perf_counter()
            self._usage = chunk.usage

    def closed(self, *, finished: bool) -> None:
        """The request is done with the job; `finished`: its last chunk was taken. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.route is not None and not self._resumed:
            self._observe_for_rollout(finished)
        if self._usage is not None:
            PROMPT_TOKENS.labels(self.model, self._route_label).inc(self._usage.prompt_tokens)
            GENERATION_TOKENS.labels(self.model, self._route_label).inc(self._usage.completion_tokens)
            tokens = self._usage.completion_tokens
            if not self._resumed and tokens > 1 and self._first is not None and self._last is not None:
                TIME_PER_OUTPUT_TOKEN.labels(self.model, self._route_label).observe(
                    (self._last - self._first) / (tokens - 1)
                )
        for reason in self._finish_reasons:
            REQUEST_SUCCESS.labels(self.model, self._route_label, reason).inc()
        if self._span is not None:
            self._end_spans(finished)

    def _observe_for_rollout(self, finished: bool) -> None:
        """Count the job for its route's rollout, if one runs: a failure when it ended in an engine or
        server error, nothing when its client left or was at fault."""
        assert self.route is not None
        if finished:
            failed = self._error is not None
            if self._error is not None and self._error not in FAILURE_CODES:
                return  # the client's mistake (invalid_request)
        else:
            # The job did not end with its last chunk: past its deadline, or with a 5xx on its way
            # (its model failed to load), it failed; a client that left before is nobody's fault.
            # The error is the one in flight here, as closing is part of its unwinding; a stream's
            # error is relayed as an event first, so its deadline is what tells.
            error = sys.exc_info()[1]
            server_error = isinstance(error, OpenAIError) and error.status_code >= 500
            if not server_error and time.time() < self._deadline:
                return
            failed = True
        ttft_s = itl_s = None
        if self._first is not None and not failed:
            ttft_s = self._first - self._arrived
            tokens = self._usage.completion_tokens if self._usage is not None else 0
            if tokens > 1 and self._last is not None:
                itl_s = (self._last - self._first) / (tokens - 1)
        self._observations.record(
            self.route, self.model, failed=failed, cold=self._cold, ttft_s=ttft_s, itl_s=itl_s
        )

    def _end_spans(self, finished: bool) -> None:
        from opentelemetry.trace import Status, StatusCode

        attributes = gen_ai.response_attributes(self.model, self._usage, self._finish_reasons)
        self._span.set_attributes(attributes)
        if self._error is not None:
            self._span.set_attribute("error.type", self._error)
            self._span.set_status(Status(StatusCode.ERROR, self._error))
        if not finished:
            self._span.set_attribute("switchboard.client_left", True)
        if self._relay is not None:
            self._relay.end()
        self._span.end()
