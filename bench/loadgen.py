"""The load both systems get: streamed chat completions from the openai client, and what they measure."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from gc_pauses import metrics_urls, pauses_between, read_pauses
from openai import AsyncOpenAI
from servers import MODEL_NAME, Server

PROMPT = "Tell me a story."
WARMUP_REQUESTS = 4
# A request that takes this long is stuck; count it as an error rather than hang the benchmark.
REQUEST_TIMEOUT_S = 300.0
REDIS_SAMPLE_EVERY_S = 0.1


@dataclass
class RequestResult:
    """What one streamed request produced."""

    ttft_s: float | None
    completion_tokens: int | None
    error: str | None
    chunks: int = 0  # streamed chunks received, the usage-only last one included


@dataclass
class LevelMetrics:
    """One system at one concurrency level in one round."""

    concurrency: int
    requests: int
    wall_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tokens_per_s: float
    errors: int
    token_mismatches: int
    error_samples: list[str]
    redis_clients_idle: int | None = None
    redis_clients_peak: int | None = None
    # Other work on the machine skews both systems; the load average (ours included) hints when it did.
    load_1m_before: float | None = None
    # Switchboard only: each process's garbage collections during the level (bench/gc_pauses.py).
    gc: dict[str, dict[str, Any]] | None = None


async def one_request(client: AsyncOpenAI, max_tokens: int) -> RequestResult:
    """Stream one chat completion; note when its first text arrives and what usage says."""
    started = time.perf_counter()
    ttft: float | None = None
    tokens: int | None = None
    chunks = 0
    try:
        stream = await client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            chunks += 1
            if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                ttft = time.perf_counter() - started
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
    except Exception as exc:  # any failure, whatever its type, is one failed request
        return RequestResult(ttft, tokens, f"{type(exc).__name__}: {exc}", chunks)
    if ttft is None:
        return RequestResult(None, tokens, "stream ended without any text", chunks)
    return RequestResult(ttft, tokens, None, chunks)


async def run_batch(
    client: AsyncOpenAI, requests: int, concurrency: int, max_tokens: int
) -> list[RequestResult]:
    """Send `requests` requests, keeping `concurrency` of them in flight."""
    gate = asyncio.Semaphore(concurrency)

    async def gated() -> RequestResult:
        async with gate:
            return await one_request(client, max_tokens)

    return list(await asyncio.gather(*(gated() for _ in range(requests))))


async def redis_clients(url: str) -> int:
    """Connections Redis has open right now (including the one asking)."""
    async with aioredis.Redis.from_url(url) as conn:
        info = await conn.info("clients")
    return int(info["connected_clients"])


async def sample_redis_peak(url: str, stop: asyncio.Event) -> int:
    """Poll Redis' connected clients until told to stop; return the highest count seen."""
    peak = 0
    # One connection for the whole sampling, so the sampler adds exactly one client to the count.
    async with aioredis.Redis.from_url(url) as conn:
        while not stop.is_set():
            info = await conn.info("clients")
            peak = max(peak, int(info["connected_clients"]))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), REDIS_SAMPLE_EVERY_S)
    return peak


async def measure_level(server: Server, concurrency: int, requests: int, max_tokens: int) -> LevelMetrics:
    """Warm up, then time `requests` requests at one concurrency level."""
    async with AsyncOpenAI(
        base_url=f"{server.base_url}/v1", api_key=server.api_key, max_retries=0, timeout=REQUEST_TIMEOUT_S
    ) as client:
        load_before = round(os.getloadavg()[0], 2)
        await run_batch(client, WARMUP_REQUESTS, min(concurrency, WARMUP_REQUESTS), max_tokens)
        idle = await redis_clients(server.redis_url) if server.redis_url else None
        urls = (
            await asyncio.to_thread(metrics_urls, server.base_url, server.redis_url)
            if server.redis_url
            else {}
        )
        pauses_before = {name: await asyncio.to_thread(read_pauses, url) for name, url in urls.items()}
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample_redis_peak(server.redis_url, stop)) if server.redis_url else None
        started = time.perf_counter()
        results = await run_batch(client, requests, concurrency, max_tokens)
        wall_s = time.perf_counter() - started
        stop.set()
        peak = await sampler if sampler else None
        pauses_after = {name: await asyncio.to_thread(read_pauses, url) for name, url in urls.items()}
    level = summarize(results, concurrency, wall_s, max_tokens)
    level.redis_clients_idle, level.redis_clients_peak = idle, peak
    if urls:
        level.gc = {name: pauses_between(pauses_before[name], pauses_after[name]) for name in urls}
    level.load_1m_before = load_before
    return level


def summarize(results: list[RequestResult], concurrency: int, wall_s: float, max_tokens: int) -> LevelMetrics:
    """Percentiles, throughput and error counts of one level."""
    ttfts_ms = sorted(r.ttft_s * 1000 for r in results if r.error is None and r.ttft_s is not None)
    errors = [r.error for r in results if r.error is not None]
    mismatches = [r for r in results if r.error is None and r.completion_tokens != max_tokens]
    samples = sorted(set(errors))[:5] + [f"completion_tokens={r.completion_tokens}" for r in mismatches[:5]]
    return LevelMetrics(
        concurrency=concurrency,
        requests=len(results),
        wall_s=round(wall_s, 3),
        ttft_p50_ms=percentile(ttfts_ms, 50),
        ttft_p99_ms=percentile(ttfts_ms, 99),
        tokens_per_s=round(sum(r.completion_tokens or 0 for r in results) / wall_s, 1),
        errors=len(errors),
        token_mismatches=len(mismatches),
        error_samples=samples,
    )


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Linear-interpolation percentile (numpy's default); None for no values."""
    if not sorted_values:
        return None
    rank = (len(sorted_values) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(sorted_values) - 1)
    value = sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)
    return round(value, 2)


# --- starting and stopping the two systems ---------------------------------------------------------
