"""The scale benchmark's load: chat completions over plain HTTP to the front doors.

Open loop: Poisson arrivals at a fixed total rate, each to a model drawn by Zipf popularity (the
model of rank k is asked with weight 1 / k^s), whatever the answers take. Closed loop: a fixed number
of clients, each sending its next request when the last one is answered, to measure requests/s.
Requests alternate between the front doors. Every request is non-streamed, with a short `max_tokens`,
so that the engine's time is small next to the control plane's.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

PROMPT = "Hello"


@dataclass(frozen=True)
class Sent:
    """One request: to which model, when (unix seconds), and how it ended."""

    model: str
    sent_at: float
    seconds: float
    status: int | None  # None: no answer (a connection error, or unfinished when the phase ended)
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Answered 200."""
        return self.status == 200


class Zipf:
    """Draws models by Zipf popularity: the first is the most popular."""

    def __init__(self, models: Sequence[str], exponent: float, rng: random.Random) -> None:
        self._models = list(models)
        self._cumulative = list(
            itertools.accumulate(1.0 / rank**exponent for rank in range(1, len(models) + 1))
        )
        self._rng = rng

    def draw(self) -> str:
        """One model."""
        point = self._rng.random() * self._cumulative[-1]
        return self._models[min(bisect.bisect_right(self._cumulative, point), len(self._models) - 1)]


class Load:
    """Sends chat completions to the front doors in turn, keeping what each request did."""

    def __init__(self, base_urls: Sequence[str], max_tokens: int, timeout_s: float) -> None:
        self._urls = itertools.cycle([f"{url}/v1/chat/completions" for url in base_urls])
        self._max_tokens = max_tokens
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        self._client = httpx.AsyncClient(timeout=timeout_s, limits=limits)
        self.sent: list[Sent] = []

    async def aclose(self) -> None:
        """Close the connections."""
        await self._client.aclose()

    async def one(self, model: str) -> None:
        """Send one request and note how it ended (also when cancelled: it is then unfinished)."""
        body = {
            "model": model,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": self._max_tokens,
        }
        sent_at, started = time.time(), time.perf_counter()
        status: int | None = None
        error: str | None = None
        try:
            reply = await self._client.post(next(self._urls), json=body)
            status = reply.status_code
            if status != 200:
                error = reply.text[:200]
        except asyncio.CancelledError:
            error = "unfinished when the phase ended"
            raise
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        finally:
            self.sent.append(Sent(model, sent_at, time.perf_counter() - started, status, error))

    async def open_loop(
        self, zipf: Zipf, rate: float, duration_s: float, drain_s: float, rng: random.Random
    ) -> float:
        """Poisson arrivals at `rate` per second for `duration_s`, then up to `drain_s` for the last
        answers (what is still running then is cancelled); returns the seconds it took in all."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        due = started
        running: set[asyncio.Task[None]] = set()
        while True:
            due += rng.expovariate(rate)
            if due - started > duration_s:
                break
            await asyncio.sleep(max(0.0, due - loop.time()))
            task = asyncio.create_task(self.one(zipf.draw()))
            running.add(task)
            task.add_done_callback(running.discard)
        await asyncio.sleep(max(0.0, started + duration_s - loop.time()))
        if running:
            _, unfinished = await asyncio.wait(set(running), timeout=drain_s)
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)
        return loop.time() - started

    async def closed_loop(self, model: str, clients: int, duration_s: float) -> float:
        """`clients` clients sending requests for `model` back to back for `duration_s`; returns the
        seconds until the last answer."""
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def client() -> None:
            while loop.time() - started < duration_s:
                await self.one(model)

        await asyncio.gather(*(client() for _ in range(clients)))
        return loop.time() - started
