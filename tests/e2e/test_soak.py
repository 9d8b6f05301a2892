"""A soak: minutes of mixed traffic on two workers while workers are killed and Redis is restarted.

Through every real part: a private Redis with its append-only file, two workers holding the demo
model (vLLM CPU engines), the front door. Clients send chat and completion requests, streamed and
not, greedy and of a fixed length, and some leave early; meanwhile a random worker is killed with
SIGKILL (and a replacement started) a few times, and Redis is restarted once. The audit: every
request got exactly one outcome, a whole answer or a clear error; no text, even of a stream cut
short by its client or an error, differs from the same request's answer asked alone (nothing
duplicated, lost or garbled); Redis holds no stray key once traffic stops. The table of outcomes,
the faults and the key census go to stdout (`pytest -s`). Its stack (`two_workers`, in
tests/e2e/conftest.py) goes on to tests/e2e/test_stream_takeover.py.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import signal
import threading
import time
import urllib.request
from typing import Any

import httpx
import pytest

from switchboard.local.launcher import Component
from tests.support.key_census import clean, take_census
from tests.support.outcomes import GOOD, Outcome, call, failures, table
from tests.support.stack import MODEL, STACK_TIMEOUT_S, TWO_WORKERS_REQUEST_TIMEOUT_S, Stack

pytestmark = pytest.mark.e2e

# A worker kill, a Redis restart and a second kill, each with traffic around it; longer runs found
# nothing more in this suite's history and the whole suite must stay under 30 minutes on 2 cores.
TRAFFIC_S = 55.0
MAX_TRAFFIC_S = 180.0
# A kill waits this long for the previous kill's replacement to be warm, then goes ahead: on a 2-core
# machine a replacement's engine, sharing its core with the surviving worker's busy engine, can take
# minutes to load (once the busy worker is killed in its turn, it loads in seconds).
WHOLE_WITHIN_S = 60.0
# Dead workers' records and replica leases expire within keys.WORKER_TTL_S.
STRAYS_GONE_WITHIN_S = 60.0
CLIENTS = 4
WORKER_KILLS = 2
# No request may take longer than this; the stack's deadline is further, so a request that waits for
# its deadline shows as hung.
BOUND_S = 120.0
assert BOUND_S < TWO_WORKERS_REQUEST_TIMEOUT_S
LEAVING_SHARE = 0.2
PROMPTS = {
    "chat": ["Tell me a long story about the sea.", "Describe a busy train station."],
    "completions": ["Once upon a time", "The server streams tokens"],
}
TOKENS = (16, 64, 200)


def body(endpoint: str, prompt: str, tokens: int, *, stream: bool) -> dict[str, Any]:
    """A greedy request of exactly `tokens` tokens."""
    request: dict[str, Any] = {"model": MODEL, "max_tokens": tokens, "min_tokens": tokens, "temperature": 0}
    if stream:
        request |= {"stream": True, "stream_options": {"include_usage": True}}
    if endpoint == "chat":
        return {**request, "messages": [{"role": "user", "content": prompt}]}
    return {**request, "prompt": prompt}


def warm_replicas(stack: Stack) -> int:
    """Workers holding the model warm, as the front door sees them (0 while it cannot tell)."""
    try:
        with urllib.request.urlopen(f"{stack.base_url}/admin/models/{MODEL}", timeout=10) as response:
            status: dict[str, Any] = json.loads(response.read())
    except OSError:
        return 0
    return len([replica for replica in status["replicas"] if replica["state"] == "warm"])


def load_line(worker: Component) -> str:
    """How long the worker took to load the model, as its log says."""
    assert worker.log_path is not None
    found = re.search(rf"{MODEL} is warm after [0-9.]+ s", worker.log_path.read_text(errors="replace"))
    return found.group(0) if found else "not warm"


def is_warm(worker: Component) -> bool:
    """Whether the worker has loaded the model (its log says so)."""
    assert worker.log_path is not None
    return f"{MODEL} is warm after" in worker.log_path.read_text(errors="replace")


class Soak:
    """The traffic, the faults and what each request got."""

    def __init__(self, stack: Stack, seed: int) -> None:
        self.stack = stack
        self.rng = random.Random(seed)
        self.fault_rng = random.Random(seed + 1)
        self.outcomes: list[tuple[tuple[str, str, int], Outcome]] = []
        self.sent = 0
        self.faults: list[str] = []
        self.stop_traffic = threading.Event()
        self.replacements: list[tuple[str, Component]] = []

    async def client(self, http: httpx.AsyncClient) -> None:
        """One client: a request after another until the traffic stops, recording each one's outcome."""
        while not self.stop_traffic.is_set():
            endpoint = self.rng.choice(list(PROMPTS))
            prompt = self.rng.choice(PROMPTS[endpoint])
            tokens = self.rng.choice(TOKENS)
            stream = self.rng.random() < 0.5
            leave = self.rng.uniform(0.2, 3.0) if self.rng.random() < LEAVING_SHARE else None
            self.sent += 1
            outcome = await call(
                http,
                endpoint,
                body(endpoint, prompt, tokens, stream=stream),
                bound_s=BOUND_S,
                leave_after_s=leave,
            )
            self.outcomes.append(((endpoint, prompt, tokens), outcome))
            if outcome.kind == "error" and outcome.status in (429, 503):
                await asyncio.sleep(0.2)  # as a client told to retry later would

    async def traffic(self) -> None:
        async with httpx.AsyncClient(base_url=self.stack.base_url, timeout=BOUND_S + 30) as http:
            await asyncio.gather(*(self.client(http) for _ in range(CLIENTS)))

    def inject_faults(self, started: float) -> None:
        """Kill a random worker WORKER_KILLS times, each once the stack is whole (two warm workers),
        starting a replacement at once; restart Redis once between the kills."""
        kills = [self.fault_rng.uniform(8, 14), self.fault_rng.uniform(TRAFFIC_S - 18, TRAFFIC_S - 12)]
        redis_at = self.fault_rng.uniform(22, 28)
        replacements: list[tuple[str, Component]] = []
        for at, fault in sorted([(at, "worker") for at in kills] + [(redis_at, "redis")]):
            self.stack.wait_until(
                lambda at=at: time.monotonic() >= started + at, timeout_s=TRAFFIC_S, what="the plan"
            )
            began = time.monotonic()
            if fault == "worker":
                warm = self.wait_for_warm_workers(2, WHOLE_WITHIN_S)
                victim = self.fault_rng.choice([w for w in self.stack.workers if w.alive()])
                victim.kill()
                replacements.append((victim.name, self.stack.spawn_worker()))
                self.faults.append(
                    f"{time.monotonic() - started:5.1f} s  kill -9 {victim.name} ({warm} warm before)"
                )
            else:
                self.stack.stop_redis(signal.SIGTERM)
                self.stack.start_redis()
                self.stack.wait_serving(MODEL, timeout_s=60)
                self.faults.append(
                    f"{began - started:5.1f} s  Redis restarted (SIGTERM, append-only); "
                    f"a request served {time.monotonic() - began:.1f} s later"
                )
        self.replacements = replacements

    def note_replacements(self) -> None:
        """Once the traffic has stopped, how long each replacement took to load."""
        for victim, replacement in self.replacements:
            if replacement.killed:
                self.faults.append(
                    f"         {victim}'s replacement {replacement.name}: {load_line(replacement)}, "
                    "then killed in its turn"
                )
                continue
            self.stack.wait_until(lambda w=replacement: is_warm(w), timeout_s=180, what="a replacement")
            self.faults.append(
                f"         {victim}'s replacement {replacement.name}: {load_line(replacement)}"
            )

    def wait_for_warm_workers(self, count: int, timeout_s: float) -> int:
        """Wait until `count` workers hold the model warm, at most `timeout_s`; how many do."""
        deadline = time.monotonic() + timeout_s
        while (warm := warm_replicas(self.stack)) < count and time.monotonic() < deadline:
            time.sleep(0.5)
        return warm

    def run(self) -> float:
        """Traffic for TRAFFIC_S (longer if the faults fell behind, at most MAX_TRAFFIC_S); its seconds.

        The faults run on this thread and the traffic on another: processes (a replacement worker,
        Redis) must be started by a thread that outlives them, since a child started through
        `with_parent` gets SIGTERM when the thread that started it ends.
        """
        started = time.monotonic()
        traffic = threading.Thread(target=asyncio.run, args=(self.traffic(),), daemon=True)
        traffic.start()
        try:
            self.inject_faults(started)
            self.stack.wait_until(
                lambda: time.monotonic() >= started + TRAFFIC_S, timeout_s=TRAFFIC_S, what="the traffic"
            )
        finally:
            self.stop_traffic.set()
            traffic.join(timeout=BOUND_S + 30)
        assert not traffic.is_alive()
        assert time.monotonic() - started < MAX_TRAFFIC_S + BOUND_S
        traffic_s = time.monotonic() - started
        self.note_replacements()
        return traffic_s


async def references(base_url: str) -> dict[tuple[str, str, int], str]:
    """Each request's greedy answer, asked alone before any fault."""
    found = {}
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        for endpoint, prompts in PROMPTS.items():
            for prompt in prompts:
                for tokens in TOKENS:
                    outcome = await call(
                        http, endpoint, body(endpoint, prompt, tokens, stream=False), bound_s=120
                    )
                    assert outcome.kind == "complete" and outcome.completion_tokens == tokens, outcome
                    found[(endpoint, prompt, tokens)] = outcome.text
    return found


def test_a_soak_with_worker_kills_and_a_redis_restart_loses_nothing(two_workers: Stack) -> None:
    stack = two_workers
    stack.wait_until(lambda: warm_replicas(stack) == 2, timeout_s=STACK_TIMEOUT_S, what="two warm workers")
    expected = asyncio.run(references(stack.base_url))
    soak = Soak(stack, seed=17)
    traffic_s = soak.run()
    stopped = time.monotonic()
    # Dead workers' records expire (WORKER_TTL_S); what a request holds must be gone.
    while clean(stack.redis_url) is None and time.monotonic() - stopped < STRAYS_GONE_WITHIN_S:
        time.sleep(0.5)
    census = take_census(stack.redis_url)
    clean_s = time.monotonic() - stopped

    outcomes = [outcome for _, outcome in soak.outcomes]
    garbled = [
        f"{o.label} {o.kind} {request[2]} tokens: {o.text[:60]!r}... is not a prefix of the answer"
        for request, o in soak.outcomes
        if not expected[request].startswith(o.text)
    ]
    short = [
        f"{o.label} {request[2]} tokens: {o.completion_tokens}"
        for request, o in soak.outcomes
        if o.kind == "complete" and (o.completion_tokens != request[2] or o.text != expected[request])
    ]
    print(
        f"\nsoak: {len(outcomes)} requests from {CLIENTS} clients in {traffic_s:.0f} s on 2 workers\n"
        "faults:\n" + "\n".join(f"  {fault}" for fault in soak.faults) + "\n"
        f"outcomes:\n{table(outcomes)}\n"
        f"texts checked against the answer asked alone: {len(outcomes)}, differing: {len(garbled)}\n"
        f"keys {clean_s:.1f} s after traffic stopped:\n{census}"
    )
    assert len(outcomes) == soak.sent, "every request has exactly one outcome"
    assert failures(outcomes) == []
    assert {o.kind for o in outcomes} <= set(GOOD)
    assert garbled == []
    assert census.strays == []
    assert short == [], "a complete answer is the whole answer"
    assert len(soak.faults) == 2 * WORKER_KILLS + 1
