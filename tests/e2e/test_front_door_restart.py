"""A front door killed mid-stream: its clients resume through another front door, or their jobs end.

Two front-door processes share one Redis and one worker (vLLM CPU engine, demo model). Through
front door A go one streamed request whose client will come back, and a few whose clients will not.
A is killed with SIGKILL. The returning client re-sends its request to front door B with
`Last-Event-ID` and gets the rest of the same answer, generated once; the jobs nobody came back for
are cancelled by the worker once A's heartbeat is gone (`worker.orphan_grace_s`, shortened here).
Then Redis holds nothing of these requests but what expires by design. Figures on stdout (`-s`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from switchboard import keys
from switchboard.local.demo_model import config_entry
from switchboard.wire import Chunk, chunk_decoder
from tests.support.key_census import clean
from tests.support.outcomes import Outcome, call, read_events
from tests.support.stack import MODEL, STACK_TIMEOUT_S, Stack

pytestmark = pytest.mark.e2e

StartStack = Callable[..., contextlib.AbstractContextManager[Stack]]
# The resumed answer must still be generating when A dies: long (nearly the demo model's context),
# and A is killed after its first few events. (With 400 tokens, a loaded machine once coalesced the
# whole answer into the first five events, and nothing was left to resume.)
RESUMED_TOKENS = 960
# The abandoned jobs must outlast noticing that A is gone (its heartbeat key expires within
# keys.ROUTER_TTL_S, then ORPHAN_GRACE_S): the demo model writes 960 tokens (nearly its context) in
# under 2 s, so each asks for the most choices allowed (384 sequences of 960 tokens fill most of the
# demo engine's 1 GiB KV cache of 524,288 tokens), which keeps the engine busy for several seconds;
# six such jobs, the last ones waiting for room in the cache, outlast it even on an idle machine.
ABANDONED_TOKENS = 960
ABANDONED_CHOICES = 128
ABANDONED = 6
EVENTS_BEFORE_KILL = 3
ORPHAN_GRACE_S = 0.5
# Short, so that the in-flight slots A never released expire within the test (deadline + SLOT_GRACE_S).
REQUEST_TIMEOUT_S = 40
# A's heartbeat key expires within ROUTER_TTL_S of its death; the watch looks every ROUTER_HEARTBEAT_S
# and waits ORPHAN_GRACE_S more: a job that ended before this could not have been cancelled.
NOTICED_WITHIN_S = keys.ROUTER_TTL_S + keys.ROUTER_HEARTBEAT_S + ORPHAN_GRACE_S
ENV = {
    "SWITCHBOARD_WORKER__HEARTBEAT_S": "0.5",
    "SWITCHBOARD_WORKER__ORPHAN_GRACE_S": str(ORPHAN_GRACE_S),
}


def chat(tokens: int, choices: int = 1) -> dict[str, Any]:
    """A greedy streamed chat request that generates exactly `tokens` tokens per choice."""
    return {
        "model": MODEL,
        "n": choices,
        "messages": [{"role": "user", "content": "Tell me a long story about the sea."}],
        "max_tokens": tokens,
        "min_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def jobs_queued(store: redis.Redis) -> int:
    """Jobs ever added to the model's stream (the worker runs each job it takes once)."""
    return int(store.xinfo_stream(keys.job_stream(MODEL))["entries-added"])


def last_chunk(store: redis.Redis, job_id: str) -> Chunk | None:
    """The job's last chunk, once the worker has written it."""
    entries = store.xrevrange(keys.result_stream(job_id), count=1)
    if not entries:
        return None
    chunk = chunk_decoder.decode(entries[0][1][b"c"])
    return chunk if chunk.is_last else None


def orphans_cancelled(stack: Stack) -> set[str]:
    """The jobs the workers' orphan watch cancelled, from their logs."""
    found: set[str] = set()
    for worker in stack.workers:
        assert worker.log_path is not None
        for line in worker.log_path.read_text(errors="replace").splitlines():
            if "cancelled jobs whose front door is gone" in line:
                found.update(re.findall(r"'([0-9a-f]+)'", line))
    return found


def last_chunks(store: redis.Redis, job_ids: list[str]) -> list[Chunk] | None:
    """Every job's last chunk, once all have one."""
    chunks = [last_chunk(store, job_id) for job_id in job_ids]
    return [chunk for chunk in chunks if chunk is not None] if all(chunks) else None


# The streams ask for `id:` lines, which they resume from.
RESUMABLE = {"X-Switchboard-Resumable": "1"}


async def start_streams(
    base_url: str, tokens: int, count: int, choices: int = 1
) -> tuple[httpx.AsyncClient, list[tuple[Any, Outcome]]]:
    """`count` streams through `base_url`, each read until it has had some text; left open."""
    client = httpx.AsyncClient(base_url=base_url, timeout=60)
    opened = []
    for _ in range(count):
        outcome = Outcome("chat", True)
        response = await client.send(
            client.build_request(
                "POST", "/v1/chat/completions", json=chat(tokens, choices), headers=RESUMABLE
            ),
            stream=True,
        )
        assert response.status_code == 200
        opened.append((response, outcome))
    # Each line iterator is kept: one dropped half-read is closed when collected, and closing it
    # closes its connection, which the front door would rightly take for a client that left.
    streams = [(response.aiter_lines(), outcome) for response, outcome in opened]
    for lines, outcome in streams:
        await read_events(lines, outcome, count=EVENTS_BEFORE_KILL)
    return client, streams


async def resume(base_url: str, last_event_id: str) -> Outcome:
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        headers = {"Last-Event-ID": last_event_id}
        return await call(client, "chat", chat(RESUMED_TOKENS), bound_s=120, headers=headers)


async def answered_alone(base_url: str) -> Outcome:
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        return await call(client, "chat", chat(RESUMED_TOKENS), bound_s=120)


def test_a_killed_front_doors_clients_resume_elsewhere_and_its_other_jobs_end(
    start_stack: StartStack, demo_model_dir: Path
) -> None:
    config = {
        "router": {"request_timeout_s": REQUEST_TIMEOUT_S},
        "models": [config_entry(demo_model_dir, preload=True)],
    }
    with start_stack(config, env=ENV) as stack:
        stack.wait_serving(MODEL, timeout_s=STACK_TIMEOUT_S)
        second = stack.spawn_front_door()
        reference = asyncio.run(answered_alone(second.base_url))
        assert reference.kind == "complete" and reference.completion_tokens == RESUMED_TOKENS
        store = redis.Redis.from_url(stack.redis_url)
        queued_before = jobs_queued(store)

        async def through_a() -> tuple[list[Outcome], list[Outcome]]:
            # The long ones first: the resumed one must still be generating when A dies.
            abandoned_client, abandoned = await start_streams(
                stack.base_url, ABANDONED_TOKENS, ABANDONED, ABANDONED_CHOICES
            )
            resumer_client, resumers = await start_streams(stack.base_url, RESUMED_TOKENS, 1)
            stack.router.kill()  # SIGKILL; the open connections break under their clients
            for client in (resumer_client, abandoned_client):
                with contextlib.suppress(httpx.HTTPError):
                    await client.aclose()
            return [outcome for _, outcome in resumers], [outcome for _, outcome in abandoned]

        [before], abandoned = asyncio.run(through_a())
        killed_at = time.monotonic()
        last_id = before.event_ids[-1]
        # The returning client resumes while the abandoned jobs are watched ending, side by side.
        resumed_s = 0.0

        def resume_through_b() -> Outcome:
            nonlocal resumed_s
            outcome = asyncio.run(resume(second.base_url, last_id))
            resumed_s = time.monotonic() - killed_at
            return outcome

        returning = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        resumed = returning.submit(resume_through_b)

        abandoned_ids = [outcome.event_ids[-1].split(":")[0] for outcome in abandoned]
        # When each ended (seconds after the kill), as first seen here.
        ended_at: dict[str, float] = {}

        def all_ended() -> list[Chunk] | None:
            for job in abandoned_ids:
                if job not in ended_at and last_chunk(store, job) is not None:
                    ended_at[job] = time.monotonic() - killed_at
            # Done once every end has its time (an end seen by the second read alone is not).
            return last_chunks(store, abandoned_ids) if len(ended_at) == len(abandoned_ids) else None

        ends = stack.wait_until(all_ended, timeout_s=90, what="the abandoned jobs to end", poll_s=0.05)
        rest = resumed.result(timeout=120)
        returning.shutdown()
        ended_after = [ended_at[job] for job in abandoned_ids]
        cancelled = orphans_cancelled(stack)
        queued = jobs_queued(store) - queued_before
        # Nothing of these requests stays but what expires by design: the abandoned jobs' result
        # streams and the resume counter (RESULT_TTL_S), and A's in-flight slots, which nobody
        # released, until their deadline plus SLOT_GRACE_S (allowed with that expiry, not waited for).
        # The abandoned jobs' records, which no front door stepped away from, live until their
        # deadline plus RESULT_TTL_S: allowed with that expiry too (a fast run ends before those
        # deadlines pass).
        census = stack.wait_until(
            lambda: clean(
                stack.redis_url,
                slots_expire_within_s=REQUEST_TIMEOUT_S + keys.SLOT_GRACE_S,
                deadlines_within_s=REQUEST_TIMEOUT_S,
            ),
            timeout_s=30,
            what="no stray keys",
        )
        clean_s = time.monotonic() - killed_at
        print(
            f"\nfront door A killed (SIGKILL) with {1 + ABANDONED} streams open; "
            f"{len(before.text)} characters before the kill, then resumed through B "
            f"({rest.kind}, {rest.completion_tokens} tokens, ended {resumed_s:.1f} s after the kill); "
            f"jobs queued {queued} for {1 + ABANDONED} requests\n"
            f"{ABANDONED} clients ({ABANDONED_CHOICES} choices each) that never came back: "
            + ", ".join(
                f"{'cancelled by the orphan watch' if job in cancelled else 'not cancelled'}, "
                f"ended {after:.1f} s after the kill with {c.usage.completion_tokens if c.usage else '?'} tokens"
                for job, c, after in zip(abandoned_ids, ends, ended_after, strict=True)
            )
            + " "
            f"(of {ABANDONED_CHOICES} x {ABANDONED_TOKENS} tokens)\n"
            f"keys {clean_s:.0f} s after the kill:\n{census}"
        )
        assert before.finish is None, "the premise: the answer was still generating when A died"
        assert rest.kind == "complete", rest
        assert before.text + rest.text == reference.text, "the rest of the same answer, seamless"
        assert rest.completion_tokens == RESUMED_TOKENS
        assert queued == 1 + ABANDONED, "the resumed request queued no second job"
        # Every abandoned job still running once A's absence could be seen was cancelled by the
        # orphan watch, and its engine stopped short; the resumed one was not cancelled.
        assert before.event_ids[-1].split(":")[0] not in cancelled
        assert any(job in cancelled for job in abandoned_ids), "no abandoned job outlived A's heartbeat"
        for job_id, chunk, ended_after_s in zip(abandoned_ids, ends, ended_after, strict=True):
            assert chunk.usage is not None
            if job_id in cancelled:
                assert chunk.usage.completion_tokens < ABANDONED_CHOICES * ABANDONED_TOKENS, "aborted"
            else:
                assert ended_after_s < NOTICED_WITHIN_S, f"{job_id} ran on for nobody"
