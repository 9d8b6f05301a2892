"""How many new tokens the engine may hold before it hands a stream's output over.

By default the engine hands over every token of every stream: each wakes the request's task on the
engine's loop and goes through the output reader, although the coalescer then sends one chunk per
window anyway. So each request asks the engine to hand its output over only every N tokens (vLLM's
per-request stream interval), N being the tokens one stream gets in half a coalescing window at the
pace measured lately: the coalescer still paces the chunks, and a token waits in the engine at most
about half a window. The first token and the last are never held. The worker spends a sixth less
CPU per request at 32 streams so, and the whole stack a quarter less at one (`bench/README.md`,
"Tokens held in the engine").

The pace is measured from the chunks themselves (tokens between two chunks of one stream over the
time between them), smoothed over the model's streams, so it follows the load as it changes. A
request keeps the N it started with; one that slows down afterwards (more streams came) waits
longer for its N tokens, but never longer than N tokens take.
"""

from __future__ import annotations

import math

# The share of the coalescing window that a held token may wait in the engine.
HOLD_SHARE = 0.5
# The most tokens a stream's output may hold, however fast it goes: it bounds what a stream that
# slows down after its start waits.
MAX_HELD_TOKENS = 16
# How much each measurement moves the smoothed pace (an exponential moving average).
SMOOTHING = 0.1


class TokenPace:
    """The smoothed time one stream of a model takes per token."""

    def __init__(self) -> None:
        self._seconds_per_token: float | None = None

    @property
    def seconds_per_token(self) -> float | None:
        """The smoothed pace; None before the first measurement."""
        return self._seconds_per_token

    def observe(self, tokens: int, elapsed_s: float) -> None:
        """`tokens` more tokens of one stream arrived `elapsed_s` after its previous ones."""
        if tokens <= 0 or elapsed_s <= 0:
            return
        sample = elapsed_s / tokens
        if self._seconds_per_token is None:
            self._seconds_per_token = sample
        else:
            self._seconds_per_token += SMOOTHING * (sample - self._seconds_per_token)

    def output_every(self, window_s: float) -> int:
        """How many tokens a stream's engine output may hold, given its coalescing window: 1 (hold
        nothing) until a pace was measured or where there is no window."""
        if self._seconds_per_token is None or window_s <= 0:
            return 1
        held = math.floor(HOLD_SHARE * window_s / self._seconds_per_token)
        return max(1, min(MAX_HELD_TOKENS, held))


class StreamPace:
    """One stream's last chunk (when, and its token count so far), measured into a model's pace."""

    def __init__(self, pace: TokenPace, now: float) -> None:
        self._pace = pace
        self._at = now
        self._tokens: int | None = None

    def chunk(self, completion_tokens: int, now: float) -> None:
        """A chunk left with the stream's count so far: the gap since the previous chunk is measured
        (the first chunk's wait includes the prefill, so it only starts the count)."""
        if self._tokens is not None:
            self._pace.observe(completion_tokens - self._tokens, now - self._at)
        self._tokens = completion_tokens
        self._at = now
