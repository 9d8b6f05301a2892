"""One job on a worker, observed: its spans under the front door's, and its metrics.

The consumer makes one per job it takes (`WorkerJobObserver.taken`), and it stays current for that job's
task (`current_job()`), so the consumer's steps report to it without passing it around. Tracing on,
the job's trace context (`Job.trace`, from the front door) is the parent of:

- `switchboard.queue_wait`: from the front door sending the job to this worker taking it;
- `switchboard.cold_start`: the model load (or wake) the job waited for, with model and tier;
- `switchboard.job`: from taking the job to its last chunk written, with the GenAI attributes,
  the worker's id and whether the model was cold; under it `switchboard.triton_stream` (the job
  through the local Triton model, whose engine side continues the trace from the payload) and
  `switchboard.result_write` for the first and the last chunk (received from Triton → in Redis).
"""

from __future__ import annotations

import contextvars
import time
from typing import Any

import msgspec

from switchboard import gen_ai, tracing
from switchboard.wire import Chunk, Usage, encode
from workers.jobs.takeover import Entry
from workers.runtime.worker_metrics import COLD_START_WAIT, FIRST_CHUNK, JOBS, QUEUE_TIME, RESULT_CHUNKS
from workers.triton.engine_job import engine_job_decoder

_current: contextvars.ContextVar[WorkerJobObserver | None] = contextvars.ContextVar(
    "switchboard_worker_job", default=None
)


def current_job() -> WorkerJobObserver | None:
    """The observer of the job this task runs, if any."""
    return _current.get()


class WorkerJobObserver:
    """The spans and metrics of one job taken by this worker."""

    def __init__(self, entry: Entry, worker_id: str, slot: Any) -> None:
        job = entry.job
        self.model = job.model
        self._taken = time.perf_counter()
        self._outcome: str | None = None
        self._usage: Usage | None = None
        self._finish_reasons: list[str] = []
        self._error: str | None = None
        self._received_ns = 0
        self._chunks = 0
        self._finished = False
        self._chunks_written = RESULT_CHUNKS.labels(self.model)
        taken_ns = time.time_ns()
        enqueued_ns = _enqueued_ns(entry)
        route = job.route or ""
        QUEUE_TIME.labels(self.model, route).observe(max(0, taken_ns - enqueued_ns) / 1e9)
        warmed = _warmed_while_waiting(slot, enqueued_ns)
        self.cold = warmed is not None
        if warmed is not None:
            COLD_START_WAIT.labels(self.model, route).observe(max(0, warmed[2] - enqueued_ns) / 1e9)
        self._span: Any = None
        self._token: Any = None
        self._triton: Any = None
        if not tracing.enabled():
            return
        parent = tracing.context_from(job.trace)
        model: dict[str, Any] = {gen_ai.REQUEST_MODEL: self.model, gen_ai.WORKER_ID: worker_id}
        tracing.record_span("switchboard.queue_wait", enqueued_ns, taken_ns, parent=parent, attributes=model)
        if warmed is not None:
            tier, started_ns, warm_ns = warmed
            attributes = {**model, "switchboard.cold_start.tier": tier}
            tracing.record_span(
                "switchboard.cold_start", started_ns, warm_ns, parent=parent, attributes=attributes
            )
        attributes = {
            **gen_ai.job_attributes(job),
            gen_ai.WORKER_ID: worker_id,
            gen_ai.COLD: self.cold,
            "switchboard.job.taken_before": entry.taken_before,
        }
        self._span = tracing.start_span(
            "switchboard.job", parent=parent, start_ns=taken_ns, attributes=attributes
        )

    @classmethod
    def taken(cls, entry: Entry, worker_id: str, slot: Any) -> WorkerJobObserver:
        """Observe a job just taken, as the current job of this task."""
        observer = cls(entry, worker_id, slot)
        _current.set(observer)
        if observer._span is not None:
            from opentelemetry import context

            observer._token = context.attach(tracing.context_with(observer._span))
        return observer

    def outcome(self, outcome: str) -> None:
        """How the job ended, where the chunks do not tell (expired, skipped)."""
        self._outcome = outcome

    def traced_payload(self, payload: bytes) -> bytes:
        """The job for the Triton model, naming this job's span as its parent (tracing on)."""
        if self._span is None:
            return payload
        self._triton = tracing.start_span(
            "switchboard.triton_stream", parent=tracing.context_with(self._span)
        )
        job = engine_job_decoder.decode(payload)
        return encode(msgspec.structs.replace(job, trace=tracing.carrier_of(self._triton)))

    def received(self, chunk: Chunk) -> None:
        """A chunk came out of the Triton model."""
        if self._span is not None:
            self._received_ns = tracing.now_ns()
            if self._chunks == 0:
                self._span.add_event("first_chunk_received", timestamp=self._received_ns)
        if chunk.finish_reason is not None:
            self._finish_reasons.append(chunk.finish_reason)
        if chunk.error is not None:
            self._error = chunk.error.code
        if chunk.is_last:
            self._usage = chunk.usage
            if self._triton is not None:
                self._triton.end(end_time=self._received_ns)
                self._triton = None

    def written(self, *, is_last: bool, gone: bool) -> None:
        """The chunk last received is in Redis; `gone`: nobody reads the job's results any more."""
        self._chunks += 1
        self._finished = self._finished or is_last
        self._chunks_written.inc()
        if self._chunks == 1:
            FIRST_CHUNK.labels(self.model).observe(time.perf_counter() - self._taken)
        if gone and self._outcome is None:
            self._outcome = "aborted"
        if self._span is not None and (self._chunks == 1 or is_last):
            which = "first" if self._chunks == 1 else "last"
            tracing.record_span(
                "switchboard.result_write",
                self._received_ns,
                tracing.now_ns(),
                parent=tracing.context_with(self._span),
                attributes={"switchboard.chunk": which, "switchboard.chunk.last": is_last},
            )

    def ended(self) -> None:
        """The job's task is over."""
        failed = self._error is not None or not self._finished
        outcome = self._outcome or ("failed" if failed else "finished")
        JOBS.labels(self.model, outcome).inc()
        if self._span is None:
            return
        from opentelemetry import context
        from opentelemetry.trace import Status, StatusCode

        if self._triton is not None:
            self._triton.end()
        span = self._span
        span.set_attributes(gen_ai.response_attributes(self.model, self._usage, self._finish_reasons))
        span.set_attribute("switchboard.job.outcome", outcome)
        span.set_attribute("switchboard.chunks", self._chunks)
        if self._error is not None or outcome == "failed":
            span.set_attribute("error.type", self._error or "failed")
            span.set_status(Status(StatusCode.ERROR, self._error or outcome))
        span.end()
        if self._token is not None:
            context.detach(self._token)


def note_outcome(outcome: str) -> None:
    """How the current job ended, where its chunks do not tell (expired, skipped)."""
    observer = _current.get()
    if observer is not None:
        observer.outcome(outcome)


def _enqueued_ns(entry: Entry) -> int:
    """When the front door sent the job (from its trace carrier), else when Redis added it (ms)."""
    stamp = (entry.job.trace or {}).get(tracing.ENQUEUED_KEY)
    if stamp is not None and stamp.isdigit():
        return int(stamp)
    return int(entry.entry_id.split(b"-", 1)[0]) * 1_000_000


def _warmed_while_waiting(slot: Any, enqueued_ns: int) -> tuple[str, int, int] | None:
    """The load or wake that made the slot warm after the job was enqueued: (tier, start, end) in ns."""
    warm_since, load_started = slot.warm_since, slot.load_started
    if warm_since is None or load_started is None or warm_since * 1e9 < enqueued_ns:
        return None
    tier = "sleeping" if getattr(slot, "warmed_from", "cold") == "sleeping" else "cold"
    return tier, int(load_started * 1e9), int(warm_since * 1e9)
