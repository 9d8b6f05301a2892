"""The embeddings benchmark's load: closed-loop `/v1/embeddings` requests, one short text each.

Every system gets the same texts in the same order: a fixed list drawn with a seed from the demo
corpus's words, a few words to about 60 tokens each. `concurrency` clients each send their next
request as soon as their last one is answered, until the level's count has been sent.

The client is aiohttp, not httpx or the openai SDK: on this machine httpx spent about 3.8 ms of CPU
per request against aiohttp's 0.2 ms (1,024 requests at 32 in flight to vLLM's server), and the load
generator shares the cores with the servers it measures.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass

import aiohttp
from embedding_costs import CostMeter, LevelCosts
from loadgen import percentile

from switchboard.local.demo_model import CORPUS

TEXT_COUNT = 256
TEXT_SEED = 37
# Words per text: with the demo tokenizers, 4 to about 60 tokens.
MIN_WORDS, MAX_WORDS = 2, 26
# A request that takes this long is stuck; count it as an error rather than hang the benchmark.
REQUEST_TIMEOUT_S = 120.0
ERROR_SAMPLES = 5


@dataclass(frozen=True)
class Answered:
    """One request: how long it took, and what went wrong if anything did."""

    seconds: float
    error: str | None = None


@dataclass
class LevelMetrics:
    """One system at one concurrency level in one round."""

    concurrency: int
    requests: int
    wall_s: float
    requests_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    errors: int
    error_samples: list[str]
    # Other work on the machine skews every system; the load average (ours included) hints when it did.
    load_1m_before: float | None = None
    costs: LevelCosts | None = None


def bench_texts(count: int = TEXT_COUNT, seed: int = TEXT_SEED) -> list[str]:
    """`count` texts of MIN_WORDS to MAX_WORDS words from the demo corpus, the same for a given seed."""
    words = [word for sentence in CORPUS for word in sentence.split()]
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(words) for _ in range(rng.randint(MIN_WORDS, MAX_WORDS))) for _ in range(count)
    ]


def request_body(model: str, text: str) -> dict[str, str]:
    """One embeddings request; base64, as the official openai SDK asks unless told otherwise."""
    return {"model": model, "input": text, "encoding_format": "base64"}


async def embed_one(session: aiohttp.ClientSession, url: str, body: dict[str, str]) -> Answered:
    """Send one request; a reply other than one embedding is an error."""
    started = time.perf_counter()
    try:
        async with session.post(url, json=body) as reply:
            if reply.status != 200:
                text = await reply.text()
                return Answered(time.perf_counter() - started, f"HTTP {reply.status}: {text[:200]}")
            answer = await reply.json()
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Answered(time.perf_counter() - started, f"{type(exc).__name__}: {exc}")
    seconds = time.perf_counter() - started
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list) or len(data) != 1 or not data[0].get("embedding"):
        return Answered(seconds, f"not one embedding: {str(answer)[:200]}")
    return Answered(seconds)


async def closed_loop(
    base_url: str, model: str, texts: list[str], concurrency: int, requests: int
) -> tuple[list[Answered], float]:
    """`concurrency` clients sending `requests` requests in all, request i with text i (mod the list);
    returns the answers and the wall time."""
    url = f"{base_url}/v1/embeddings"
    bodies = [request_body(model, text) for text in texts]
    next_index = 0
    answers: list[Answered] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def client() -> None:
            nonlocal next_index
            while next_index < requests:
                body = bodies[next_index % len(bodies)]
                next_index += 1
                answers.append(await embed_one(session, url, body))

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return answers, time.perf_counter() - started


async def measure_level(
    base_url: str,
    model: str,
    texts: list[str],
    concurrency: int,
    requests: int,
    warmup: int,
    meter: CostMeter | None = None,
) -> LevelMetrics:
    """`warmup` requests at the level's concurrency (not counted), then `requests` timed ones, their
    costs read by `meter` where there is one."""
    load_before = round(os.getloadavg()[0], 2)
    if warmup:
        await closed_loop(base_url, model, texts, min(concurrency, warmup), warmup)
    if meter is not None:
        meter.start()
    answers, wall_s = await closed_loop(base_url, model, texts, concurrency, requests)
    level = summarize(answers, concurrency, wall_s)
    level.load_1m_before = load_before
    if meter is not None:
        level.costs = meter.stop(requests - level.errors, wall_s)
    return level


def summarize(answers: list[Answered], concurrency: int, wall_s: float) -> LevelMetrics:
    """Requests per second (answered ones), latency percentiles and errors of one level."""
    latencies_ms = sorted(a.seconds * 1000 for a in answers if a.error is None)
    errors = [a.error for a in answers if a.error is not None]
    return LevelMetrics(
        concurrency=concurrency,
        requests=len(answers),
        wall_s=round(wall_s, 3),
        requests_per_s=round(len(latencies_ms) / wall_s, 1) if wall_s > 0 else 0.0,
        p50_ms=percentile(latencies_ms, 50),
        p99_ms=percentile(latencies_ms, 99),
        errors=len(errors),
        error_samples=sorted(set(errors))[:ERROR_SAMPLES],
    )
