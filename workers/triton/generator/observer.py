"""One job inside its Triton model, observed: the engine's span, and its time to first output.

Runs on PyTriton's event loop, where the engine is driven. Tracing on, the job's payload names the
worker's `switchboard.triton_stream` span as its parent (`workers.jobs.observer`); the engine's span
(`switchboard.engine.generate`, GenAI attributes) is current for the task that drives the engine,
so the engine's own spans (`switchboard.prompt_build`, `switchboard.prefill`,
`switchboard.decode`) nest under it. Its events mark the first output of the engine and the first
chunk handed to Triton: the coalescing window lies between them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from switchboard import gen_ai, tracing
from switchboard.wire import Job
from workers.engines.base import Delta
from workers.runtime.worker_metrics import ENGINE_FIRST_TOKEN


class EngineObserver:
    """The engine's side of one job."""

    def __init__(self, job: Job) -> None:
        self.model = job.model
        self._started = time.perf_counter()
        self._first_output = False
        self._first_sent = False
        self._usage: tuple[int, int] | None = None
        self._finish_reasons: list[str] = []
        self._span: Any = None
        if tracing.enabled() and job.trace:
            self._span = tracing.start_span(
                "switchboard.engine.generate",
                parent=tracing.context_from(job.trace),
                attributes=gen_ai.job_attributes(job),
            )

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """The engine's span is current inside the block (tasks created there inherit it)."""
        if self._span is None:
            yield
            return
        with tracing.current(self._span):
            yield

    def output(self, delta: Delta) -> None:
        """The engine produced `delta`."""
        if not self._first_output:
            self._first_output = True
            ENGINE_FIRST_TOKEN.labels(self.model).observe(time.perf_counter() - self._started)
            if self._span is not None:
                self._span.add_event("first_output")
        if delta.finish_reason is not None:
            self._finish_reasons.append(delta.finish_reason)
        if delta.last:
            self._usage = (delta.prompt_tokens, delta.completion_tokens)

    def sent(self) -> None:
        """A chunk was handed to Triton."""
        if not self._first_sent:
            self._first_sent = True
            if self._span is not None:
                self._span.add_event("first_chunk_sent")

    def ended(self) -> None:
        """The job's stream is over."""
        if self._span is None:
            return
        from switchboard.wire import Usage

        usage = Usage(prompt_tokens=self._usage[0], completion_tokens=self._usage[1]) if self._usage else None
        self._span.set_attributes(gen_ai.response_attributes(self.model, usage, self._finish_reasons))
        self._span.end()
