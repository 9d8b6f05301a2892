"""The primary Redis, watched by Sentinel, is killed under load: the stack follows the promoted replica.

Through every real part: a primary, a replica and three sentinels (real redis-server processes,
tests/support/sentinel.py), a worker with a vLLM CPU engine on the demo model and the front door,
both given the `redis+sentinel://` URL. Eight requests (streamed and not, chat and completions) are
generating, and more keep arriving, when the primary is SIGKILLed. Every request must end whole
(the greedy reference text) or with a clear 503 soon after the promotion; none may hang or be
answered twice; new requests are served again with nobody stepping in. `pytest -s` shows the
figures, the time from the kill to the first request served among them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from switchboard.local.demo_model import config_entry
from tests.support.fault_traffic import ARRIVAL_EVERY_S, FaultTraffic, greedy_body
from tests.support.outcomes import Outcome, call, failures, table
from tests.support.sentinel import SentinelTopology
from tests.support.stack import MODEL, STACK_TIMEOUT_S, Stack

pytestmark = pytest.mark.e2e

StartStack = Callable[..., contextlib.AbstractContextManager[Stack]]
TOKENS = 96
ARRIVAL_TOKENS = 16
# No request may take longer than this; the deadline is further still, so that a request left
# waiting for its deadline shows as hung rather than as a 504.
BOUND_S = 90.0
REQUEST_TIMEOUT_S = 300
# An error must come this soon after the promotion (README: "within seconds").
ERROR_WITHIN_S = 10.0
# A request must be served this soon after the kill.
RECOVERY_BOUND_S = 20.0
ARRIVALS_AFTER_RECOVERY = 4
FAST = {"SWITCHBOARD_WORKER__HEARTBEAT_S": "0.5", "SWITCHBOARD_WORKER__TAKEOVER_CHECK_S": "0.5"}
IN_FLIGHT = [(endpoint, stream) for endpoint in ("chat", "completions") for stream in (True, False)] * 2
ARRIVING = [("chat", True), ("completions", False), ("completions", True), ("chat", False)]


@pytest.fixture
def topology() -> Iterator[SentinelTopology]:
    with SentinelTopology() as started:
        yield started


async def references(client: httpx.AsyncClient) -> dict[tuple[str, int], str]:
    """The greedy answer of each request used, asked alone before the kill."""
    found = {}
    for endpoint in ("chat", "completions"):
        for tokens in (TOKENS, ARRIVAL_TOKENS):
            outcome = await call(
                client, endpoint, greedy_body(endpoint, stream=False, tokens=tokens), bound_s=60
            )
            assert outcome.kind == "complete", outcome
            found[(endpoint, tokens)] = outcome.text
    return found


async def kill_under_load(stack: Stack, topology: SentinelTopology) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=BOUND_S + 30) as client:
        expected = await references(client)
        traffic = FaultTraffic(
            client,
            in_flight=IN_FLIGHT,
            arriving=ARRIVING,
            tokens=TOKENS,
            arrival_tokens=ARRIVAL_TOKENS,
            bound_s=BOUND_S,
        )
        await traffic.start(first_text_within_s=60)
        old = topology.kill_primary()
        killed_at = time.monotonic()
        promotion = asyncio.create_task(asyncio.to_thread(topology.wait_promoted, old.port))
        probes = await traffic.until_served(killed_at, RECOVERY_BOUND_S)
        served_at = time.monotonic()
        promoted_at = await promotion
        await traffic.finish(ARRIVALS_AFTER_RECOVERY)
    return {
        "expected": expected,
        "accepted": traffic.accepted,
        "arrived": traffic.arrived,
        "probes": probes,
        "killed_at": killed_at,
        "promoted_at": promoted_at,
        "served_at": served_at,
    }


def entry_order(event_id: str) -> tuple[int, int]:
    """`JOB:MS-SEQ`, the result stream's entry the event came from, as a sortable pair."""
    milliseconds, _, sequence = event_id.rpartition(":")[2].partition("-")
    return int(milliseconds), int(sequence)


def audit(figures: dict[str, Any]) -> None:
    """Print the figures; fail on a request that hung, was cut, answered twice or erred late or vaguely."""
    accepted: list[Outcome] = figures["accepted"]
    arrived: list[Outcome] = figures["arrived"]
    expected = figures["expected"]
    killed_at, promoted_at = figures["killed_at"], figures["promoted_at"]
    print(
        f"\nPrimary Redis SIGKILLed under load (Sentinel): {len(accepted)} requests generating, "
        f"{len(arrived)} arriving every {ARRIVAL_EVERY_S:g} s; replica promoted "
        f"{promoted_at - killed_at:.1f} s after the kill; first request served "
        f"{figures['served_at'] - killed_at:.2f} s after the kill ({len(figures['probes'])} tries)\n"
        f"generating at the kill:\n{table(accepted)}\narriving meanwhile:\n{table(arrived)}"
    )
    # The premise: all eight were still generating when the primary died.
    assert all(o.ended > killed_at for o in accepted), "a request ended before the kill: longer answers"
    everything = accepted + arrived
    assert failures(everything) == []
    wrong = [
        f"{o.label}: {o.completion_tokens} tokens, text {'equal' if o.text == expected[(o.endpoint, tokens)] else 'differs'}"
        for group, tokens in ((accepted, TOKENS), (arrived, ARRIVAL_TOKENS))
        for o in group
        if o.kind == "complete"
        and (o.completion_tokens != tokens or o.text != expected[(o.endpoint, tokens)])
    ]
    assert wrong == [], "complete answers must be whole and the same greedy text as when asked alone"
    # The events of one chunk share its id; a chunk relayed again would take an id back.
    replayed = [
        o.label
        for o in everything
        if [entry_order(i) for i in o.event_ids] != sorted(map(entry_order, o.event_ids))
    ]
    assert replayed == [], "no stream may relay a chunk twice"
    vague = [
        f"{o.label}: {o.status} {o.code} {o.seconds:.1f} s, ended {o.ended - promoted_at:+.1f} s after the promotion"
        for o in everything
        if o.kind == "error"
        and (
            o.code not in ("redis_restarted", "redis_unavailable")
            or (o.status is not None and o.status not in (200, 503))
            or o.ended - promoted_at > ERROR_WITHIN_S
        )
    ]
    assert vague == [], "an error must be a 503 saying Redis failed, within seconds of the promotion"


def test_a_killed_primary_under_load_loses_no_request(
    start_stack: StartStack, demo_model_dir: Path, topology: SentinelTopology
) -> None:
    config = {
        "router": {"request_timeout_s": REQUEST_TIMEOUT_S},
        "models": [config_entry(demo_model_dir, preload=True)],
    }
    with start_stack(config, env=FAST, redis=topology.url) as stack:
        stack.wait_serving(MODEL, timeout_s=STACK_TIMEOUT_S)
        audit(asyncio.run(kill_under_load(stack, topology)))
