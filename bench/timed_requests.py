"""Requests timed the same way for every system the cold-start benchmark compares.

A `Measurement` is one timed step with the machine's load before it; `ttft` times a streamed
request to its first text while a check watches the system's processes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import openai
from loadgen import PROMPT
from servers import PROGRESS_EVERY_S, READY_TIMEOUT_S

T = TypeVar("T")


class MeasurementError(RuntimeError):
    """A measurement could not be taken; the message says which system, and where its logs are."""


@dataclass
class Measurement:
    """One timed step: seconds (a median where there are samples), and the machine's load before it."""

    seconds: float
    load_1m_before: float
    samples: list[float] = field(default_factory=list)
    worker_log: list[str] = field(default_factory=list)  # the worker's own lines logged meanwhile
    note: str = ""


def client_for(base_url: str) -> openai.AsyncOpenAI:
    """The openai client both systems get: no retries, a short connect timeout, a long read timeout."""
    timeout = openai.Timeout(READY_TIMEOUT_S, connect=5.0)
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=timeout)


async def first_token_at(client: openai.AsyncOpenAI, model: str, max_tokens: int) -> float:
    """Stream one chat completion to its end; return when its first text arrived (perf_counter)."""
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
    )
    first: float | None = None
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter()
    if first is None:
        raise MeasurementError(f"{model}: the stream ended without any text")
    return first


async def watched(work: Awaitable[T], check: Callable[[], None], timeout_s: float, what: str) -> T:
    """Await `work` while `check` finds every process alive (it raises otherwise); give up after timeout_s."""
    task = asyncio.ensure_future(work)
    started = time.monotonic()
    next_report = started + PROGRESS_EVERY_S
    try:
        while not (await asyncio.wait({task}, timeout=0.5))[0]:
            check()
            if (elapsed := time.monotonic() - started) > timeout_s:
                raise MeasurementError(f"{what}: nothing after {timeout_s:.0f} s")
            if time.monotonic() >= next_report:
                print(f"    {what}: waiting ({elapsed:.0f} s)", flush=True)
                next_report += PROGRESS_EVERY_S
        return task.result()
    finally:
        task.cancel()


async def ttft(client: openai.AsyncOpenAI, model: str, max_tokens: int, check: Callable[[], None]) -> float:
    """Seconds from sending a streamed request to its first text."""
    sent = time.perf_counter()
    return await watched(first_token_at(client, model, max_tokens), check, READY_TIMEOUT_S, model) - sent


async def warm_ttfts(
    client: openai.AsyncOpenAI, model: str, args: argparse.Namespace, check: Callable[[], None]
) -> Measurement:
    """The median TTFT of `args.warm_requests` requests, one after another, to a loaded model."""
    load = load_1m()
    samples = [round(await ttft(client, model, args.max_tokens, check), 4) for _ in range(args.warm_requests)]
    return Measurement(statistics.median(samples), load, samples)


def load_1m() -> float:
    """The machine's 1-minute load average (our own servers included)."""
    return round(os.getloadavg()[0], 2)


def progress(system: str, label: str, measured: Measurement) -> None:
    """One line per measurement as it is taken, with what the worker logged meanwhile."""
    note = f", {measured.note}" if measured.note else ""
    print(
        f"    {system}: {label}: {measured.seconds:.3f} s (load {measured.load_1m_before}{note})", flush=True
    )
    for line in measured.worker_log:
        print(f"      | {line[:160]}", flush=True)
