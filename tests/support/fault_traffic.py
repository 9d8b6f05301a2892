"""Traffic around a fault in Redis (a restart, a failover): long requests generating when it
strikes, more arriving all the while, and probes until the first one is served again.

The e2e tests of Redis restarts and of Sentinel failovers share it; each brings its own fault and
its own audit of the outcomes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import pytest

from tests.support.outcomes import Outcome, call
from tests.support.stack import MODEL

ARRIVAL_EVERY_S = 0.25
PROBE = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2}
Request = tuple[str, bool]  # endpoint, streamed


def greedy_body(endpoint: str, *, stream: bool, tokens: int) -> dict[str, Any]:
    """A greedy request that generates exactly `tokens` tokens (the demo model would stop early)."""
    request: dict[str, Any] = {"model": MODEL, "max_tokens": tokens, "min_tokens": tokens, "temperature": 0}
    if stream:
        request |= {"stream": True, "stream_options": {"include_usage": True}}
    if endpoint == "chat":
        return {**request, "messages": [{"role": "user", "content": "Tell me a long story about the sea."}]}
    return {**request, "prompt": "Once upon a time"}


async def wait_for(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    """Poll `condition` until true; fail naming `what` past `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout_s:g} s for {what}")
        await asyncio.sleep(0.05)


class FaultTraffic:
    """`in_flight` requests of `tokens` tokens, then `arriving` ones of `arrival_tokens` in turn,
    one every ARRIVAL_EVERY_S, each bounded by `bound_s`; outcomes in `accepted` and `arrived`."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        in_flight: Sequence[Request],
        arriving: Sequence[Request],
        tokens: int,
        arrival_tokens: int,
        bound_s: float,
    ) -> None:
        self._client = client
        self._arriving = arriving
        self._tokens, self._arrival_tokens, self._bound_s = tokens, arrival_tokens, bound_s
        self.accepted = [Outcome(endpoint, stream) for endpoint, stream in in_flight]
        self.arrived: list[Outcome] = []
        self._tasks: list[asyncio.Task[Outcome]] = []
        self._arrivals: asyncio.Task[None] | None = None

    async def start(self, first_text_within_s: float) -> None:
        """Send the in-flight requests, wait until every streamed one has text (all are admitted
        and generating), then start the arrivals."""
        for outcome in self.accepted:
            self._send(outcome, self._tokens)
        await wait_for(
            lambda: all(o.text for o in self.accepted if o.stream),
            first_text_within_s,
            "every stream's first text",
        )
        self._arrivals = asyncio.create_task(self._arrive())

    async def until_served(self, since: float, bound_s: float) -> list[Outcome]:
        """Probe with a short chat request until one completes; fail past `bound_s` after `since`."""
        probes: list[Outcome] = []
        while not probes or probes[-1].kind != "complete":
            if time.monotonic() - since > bound_s:
                pytest.fail(f"no request served within {bound_s:g} s: {probes[-3:]}")
            probes.append(await call(self._client, "chat", PROBE, bound_s=bound_s))
            await asyncio.sleep(0.05)
        return probes

    async def finish(self, more_arrivals: int) -> None:
        """Let `more_arrivals` more requests arrive, stop the arrivals and wait for every request."""
        sent_before = len(self.arrived)
        await wait_for(lambda: len(self.arrived) >= sent_before + more_arrivals, 30, "more arrivals")
        assert self._arrivals is not None, "start() first"
        self._arrivals.cancel()
        await asyncio.gather(self._arrivals, return_exceptions=True)
        await asyncio.gather(*self._tasks)

    def _send(self, outcome: Outcome, tokens: int) -> None:
        request = greedy_body(outcome.endpoint, stream=outcome.stream, tokens=tokens)
        self._tasks.append(
            asyncio.create_task(
                call(self._client, outcome.endpoint, request, bound_s=self._bound_s, into=outcome)
            )
        )

    async def _arrive(self) -> None:
        while True:
            endpoint, stream = self._arriving[len(self.arrived) % len(self._arriving)]
            self.arrived.append(Outcome(endpoint, stream))
            self._send(self.arrived[-1], self._arrival_tokens)
            await asyncio.sleep(ARRIVAL_EVERY_S)
