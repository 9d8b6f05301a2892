"""Redis restarted under load: every accepted request gets its whole answer or a clear error, none
hangs, none is cut short, and new requests succeed soon after Redis is back.

Through every real part: a private redis-server, a worker with a vLLM CPU engine on the demo model,
the front door. Eight requests (streamed and not, chat and completions) are generating, and more
keep arriving, when Redis is stopped (SIGTERM: it writes its file and exits; SIGKILL: a crash) and
started again on the same port. With append-only persistence (appendfsync everysec, as
`switchboard up` runs it) a clean stop loses nothing. Without it (many managed caches) the restart
loses every job: each request in flight then gets a 503 `redis_restarted` within seconds of Redis's
return, none waits for its deadline. The three restarts run one after the other on one stack (each
a fresh outage: it waits for what its worker logs from then on), the one without persistence last:
that Redis is started again empty, without its append-only file, and keeps nothing on disk from
then on, as one without persistence does. Each test prints its figures: `pytest -s` shows them.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from switchboard.local.demo_model import config_entry
from switchboard.local.launcher import probe_readiness
from tests.support.fault_traffic import ARRIVAL_EVERY_S, FaultTraffic, greedy_body, wait_for
from tests.support.outcomes import Outcome, call, failures, table
from tests.support.stack import MODEL, STACK_TIMEOUT_S, Stack, running_stack

pytestmark = pytest.mark.e2e

TOKENS = 400
ARRIVAL_TOKENS = 32
# No request may take longer than this, however the restart went; the deadline is further still,
# so that a request left waiting for its deadline shows as hung rather than as a 504.
BOUND_S = 150.0
REQUEST_TIMEOUT_S = 300
# New requests must succeed this soon after Redis is back.
RECOVERY_BOUND_S = 20.0
# A request whose job a restart lost is failed this soon after Redis is back.
LOST_BOUND_S = 10.0
# The errors a request may get while Redis is away or back empty; anything else (a 504 above all)
# means a request waited for what would never come.
OUTAGE_CODES = {"redis_unavailable", "redis_restarted"}
ARRIVALS_AFTER_RECOVERY = 8
FAST = {"SWITCHBOARD_WORKER__HEARTBEAT_S": "0.5", "SWITCHBOARD_WORKER__TAKEOVER_CHECK_S": "0.5"}
IN_FLIGHT = [(endpoint, stream) for endpoint in ("chat", "completions") for stream in (True, False)] * 2
# Logged by the worker's result writer once its retries are spent (not its "; retrying" warning).
GIVEN_UP = re.compile(r"writing result chunks failed(?!; retrying)")
ARRIVING = [("chat", True), ("completions", False), ("completions", True), ("chat", False)]


async def references(base_url: str) -> dict[tuple[str, int], str]:
    """The greedy answer of each request used, asked alone before any fault."""
    found = {}
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        for endpoint in ("chat", "completions"):
            for tokens in (TOKENS, ARRIVAL_TOKENS):
                outcome = await call(
                    client, endpoint, greedy_body(endpoint, stream=False, tokens=tokens), bound_s=120
                )
                assert outcome.kind == "complete", outcome
                found[(endpoint, tokens)] = outcome.text
    return found


def log_sizes(stack: Stack) -> dict[Path, int]:
    """How long each log is now: where what is logged from now on starts."""
    return {path: path.stat().st_size for path in stack.log_paths.values()}


def writes_given_up(stack: Stack, since: dict[Path, int]) -> bool:
    """Whether the worker gave up writing a chunk (its retries spent) since `since`, leaving its job
    for a takeover."""
    for path in stack.log_paths.values():
        with path.open("rb") as log:
            log.seek(since.get(path, 0))
            if GIVEN_UP.search(log.read().decode(errors="replace")):
                return True
    return False


async def restart_under_load(
    stack: Stack, sig: signal.Signals, *, long_outage: bool, min_down_s: float = 0.0, keep_files: bool = True
) -> dict[str, Any]:
    """Eight long requests generating and more arriving; Redis stopped with `sig` and started again
    (empty unless `keep_files`).

    Redis stays down until the front door has noticed, and at least `min_down_s` (while requests
    keep arriving); with `long_outage`, also until the worker
    has given up writing a chunk (so the jobs it was running are taken over after the restart).
    """
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=BOUND_S + 30) as client:
        traffic = FaultTraffic(
            client,
            in_flight=IN_FLIGHT,
            arriving=ARRIVING,
            tokens=TOKENS,
            arrival_tokens=ARRIVAL_TOKENS,
            bound_s=BOUND_S,
        )
        # Every streamed one has text: all eight were admitted together and are generating.
        await traffic.start(first_text_within_s=120)
        stopped_at = time.monotonic()
        logged_before = log_sizes(stack)
        await asyncio.to_thread(stack.stop_redis, sig)
        # Down until the front door has noticed (it reports not ready), then back.
        await wait_for(lambda: probe_readiness(stack.base_url) is not None, 30, "the front door to notice")
        if long_outage:
            await wait_for(lambda: writes_given_up(stack, logged_before), 30, "the worker to give up a write")
        await asyncio.sleep(max(0.0, min_down_s - (time.monotonic() - stopped_at)))
        down_s = time.monotonic() - stopped_at
        # On this thread, which outlives it: a child started through `with_parent` gets SIGTERM when
        # the thread that started it ends (an executor thread would end with this event loop).
        stack.start_redis(keep_files=keep_files)
        back_at = time.monotonic()
        probes = await traffic.until_served(back_at, RECOVERY_BOUND_S)
        recovered_s = time.monotonic() - back_at
        await traffic.finish(ARRIVALS_AFTER_RECOVERY)
        ended_s = time.monotonic() - back_at
    return {
        "accepted": traffic.accepted,
        "arrived": traffic.arrived,
        "probes": probes,
        "down_s": down_s,
        "back_at": back_at,
        "recovered_s": recovered_s,
        "ended_s": ended_s,
    }


def audit(
    figures: dict[str, Any], expected: dict[tuple[str, int], str], what: str, *, lossless: bool
) -> None:
    """Print the figures; fail on any request that hung, was cut short, got a wrong answer or an
    error other than Redis's absence or loss; a loss must be told within seconds, and only where
    the restart could lose jobs (not `lossless`)."""
    accepted: list[Outcome] = figures["accepted"]
    arrived: list[Outcome] = figures["arrived"]
    print(
        f"\nRedis restarted ({what}) under load: {len(accepted)} requests generating, "
        f"{len(arrived)} arriving every {ARRIVAL_EVERY_S:g} s; Redis down {figures['down_s']:.1f} s; "
        f"first request served {figures['recovered_s']:.2f} s after its return "
        f"({len(figures['probes'])} tries); every request ended {figures['ended_s']:.1f} s after it\n"
        f"generating when Redis stopped:\n{table(accepted)}\narriving meanwhile:\n{table(arrived)}"
    )
    assert failures(accepted + arrived) == []
    errors = [o for o in accepted + arrived if o.kind == "error"]
    assert [f"{o.label} {o.status} {o.code}" for o in errors if o.code not in OUTAGE_CODES] == []
    lost = [o for o in errors if o.code == "redis_restarted"]
    if lossless:
        assert lost == [], "nothing accepted is lost"
    late = [
        f"{o.label} {o.ended - figures['back_at']:.1f} s"
        for o in lost
        if o.ended - figures["back_at"] > LOST_BOUND_S
    ]
    assert late == [], f"a lost job is told within {LOST_BOUND_S:g} s of Redis's return"
    wrong = [
        f"{o.label}: {o.completion_tokens} tokens, text {'equal' if o.text == expected[(o.endpoint, tokens)] else 'differs'}"
        for group, tokens in ((accepted, TOKENS), (arrived, ARRIVAL_TOKENS))
        for o in group
        if o.kind == "complete"
        and (o.completion_tokens != tokens or o.text != expected[(o.endpoint, tokens)])
    ]
    assert wrong == [], "complete answers must be whole and the same greedy text as when asked alone"


def config(demo_model_dir: Path) -> dict[str, Any]:
    return {
        "router": {"request_timeout_s": REQUEST_TIMEOUT_S},
        "models": [config_entry(demo_model_dir, preload=True)],
    }


@pytest.fixture(scope="module")
def restarted_stack(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, demo_model_dir: Path
) -> Iterator[tuple[Stack, dict[tuple[str, int], str]]]:
    """A stack whose Redis keeps an append-only file, serving, and the greedy answers asked before
    any fault; shared by the three restarts."""
    root = tmp_path_factory.mktemp("append-only")
    with running_stack(
        config(demo_model_dir), root=root, env=FAST, persist_redis=True, session=request.session
    ) as stack:
        stack.wait_serving(MODEL, timeout_s=STACK_TIMEOUT_S)
        yield stack, asyncio.run(references(stack.base_url))


# Without persistence last: Redis comes back empty, and keeps no files from then on.
@pytest.mark.parametrize(
    ("sig", "persist", "long_outage"),
    [(signal.SIGTERM, True, False), (signal.SIGKILL, True, True), (signal.SIGKILL, False, False)],
    ids=["sigterm", "sigkill-long-outage", "sigkill-no-persistence"],
)
def test_redis_restarted_under_load_loses_no_request(
    restarted_stack: tuple[Stack, dict[tuple[str, int], str]],
    sig: signal.Signals,
    persist: bool,
    long_outage: bool,
) -> None:
    stack, expected = restarted_stack
    restart_and_audit(stack, expected, sig, persist=persist, long_outage=long_outage)


def restart_and_audit(
    stack: Stack,
    expected: dict[tuple[str, int], str],
    sig: signal.Signals,
    *,
    persist: bool,
    long_outage: bool,
) -> None:
    # Without persistence, down 3 s while requests keep arriving, as an operator's restart is.
    min_down_s = 0.0 if persist else 3.0
    figures = asyncio.run(
        restart_under_load(stack, sig, long_outage=long_outage, min_down_s=min_down_s, keep_files=persist)
    )
    what = f"{sig.name}, {'append-only' if persist else 'no persistence: it comes back empty'}"
    if long_outage:
        what += ", down until the worker gave up a write"
    audit(figures, expected, what, lossless=sig == signal.SIGTERM)
