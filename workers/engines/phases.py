"""The prefill and decode spans of one engine request, timed from the engine's own outputs.

Made only while tracing is on (`switchboard.tracing.enabled()`): prefill runs from the request
handed to the engine to its first output (the first token), decode from there to its last output.
"""

from __future__ import annotations

from switchboard import tracing


class EnginePhases:
    """Times one request's outputs; `end()` records the spans under the current span."""

    __slots__ = ("_first_ns", "_input_tokens", "_last_ns", "_outputs", "_submitted_ns")

    def __init__(self, input_tokens: int) -> None:
        self._input_tokens = input_tokens
        self._submitted_ns = tracing.now_ns()
        self._first_ns = 0
        self._last_ns = 0
        self._outputs = 0

    def output(self) -> None:
        """The engine produced an output for the request."""
        self._last_ns = tracing.now_ns()
        if not self._first_ns:
            self._first_ns = self._last_ns
        self._outputs += 1

    def end(self) -> None:
        """Record `switchboard.prefill` and `switchboard.decode` (as far as the request got)."""
        ended_ns = tracing.now_ns()
        first_ns = self._first_ns or ended_ns
        tracing.record_span(
            "switchboard.prefill",
            self._submitted_ns,
            first_ns,
            attributes={"gen_ai.usage.input_tokens": self._input_tokens},
        )
        if self._first_ns:
            tracing.record_span(
                "switchboard.decode",
                self._first_ns,
                self._last_ns,
                attributes={"switchboard.engine.outputs": self._outputs},
            )
