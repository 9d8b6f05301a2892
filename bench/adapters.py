"""LoRA adapters side by side: N fine-tunes of the demo model served as adapters on one warm base by
Switchboard, the base alone, the same fine-tunes merged into whole models (today's only way), and
vLLM's own server loading each adapter at runtime on its first request.

Every setup gets the same arrivals: `--requests` streamed chat requests (max_tokens 16, temperature
0) sent at Poisson times at `--rate` requests/s, each naming an adapter drawn by Zipf popularity
(s=1.1), with a fixed seed. Per request: the time to first token, and whether it was its model's
first request (cold) or not (warm). The base alone gets the same times, every request to the base;
the merged models (at most 10) get the requests whose adapter is one of them.

    .venv/bin/python bench/adapters.py --adapters 10 --requests 60 --rate 4

The targets: a cold adapter's TTFT p50 within 2x of a warm one's; adapters at 0.8x the base alone's
requests/s or more; adapters at 10x the merged models' requests/s or more.

`--distinct K` (default min(N, 20)) builds K adapter folders; adapter i (ft-{i+1}) is folder i % K,
every name still an adapter of its own to the engine (Switchboard's and vLLM's server alike); the
merged models are the first min(K, 10) folders. `--registered`: the Switchboard stack's config holds
the base alone (with its `lora` table) and the N adapters are registered through the admin API
(`POST /admin/adapters`) once the base is warm, before any request; the report gives the
registrations/s and how long after the last one the worker knew them all.

`--idle-check`: with that stack up and idle, Redis commands/s over 10 s (`INFO stats`
`total_commands_processed`) with 10 adapters registered, then again 3 s after registering up to
10,000 (`idle-{n}`, over the same folders); the target is the same rate (ratio ≤ 1.1), since every
process polls one version key however many are registered. The front door's and the worker's
resident memory are read before and after. With `--requests 0` nothing is replayed:

    .venv/bin/python bench/adapters.py --adapters 10 --requests 0 --idle-check --registered --skip-vllm
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import openai  # noqa: E402
from openai.types.chat import ChatCompletionMessageParam  # noqa: E402
from servers import DEMO_ENGINE_FLAGS, spawn_vllm, wait_ready  # noqa: E402

from switchboard.local.demo_model import build_demo_model, config_entry  # noqa: E402
from tests.support.adapters import build_adapter, build_merged  # noqa: E402
from tests.support.stack import Stack, running_stack  # noqa: E402

BASE = "demo"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me about the sea."}]
ZIPF_S = 1.1
SEED = 2026
MAX_MERGED = 10
TIMEOUT_S = 900.0
# --distinct's default: at most this many adapter folders built with peft.
MAX_DISTINCT = 20
# The keep-alive each registered adapter gets.
REGISTERED_KEEP_ALIVE_S = 300
PROGRESS_EVERY = 100
# How long the worker may take to know every registered adapter (its log says how many it holds).
KNOWN_TIMEOUT_S = 300.0
# The idle check: registered adapters before and after, the window and the settling time, the target.
IDLE_BEFORE = 10
IDLE_TOTAL = 10_000
IDLE_WINDOW_S = 10.0
IDLE_SETTLE_S = 3.0
IDLE_TARGET = 1.1


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Outcome:
    """One setup's run: per request (model, cold, ttft or None on error), the wall time, the loads."""

    setup: str
    rows: list[tuple[str, bool, float | None]] = field(default_factory=list)
    wall_s: float = 0.0
    loads: int | None = None
    errors: list[str] = field(default_factory=list)
    skipped: str | None = None

    def ttfts(self, cold: bool) -> list[float]:
        return [t for _, c, t in self.rows if c == cold and t is not None]

    @property
    def rate(self) -> float | None:
        done = sum(1 for *_, t in self.rows if t is not None)
        return done / self.wall_s if self.wall_s > 0 and done else None


def arrivals(requests: int, rate: float, adapters: int) -> list[tuple[float, int]]:
    """(send time in s from the start, adapter index 0..N-1) per request: Poisson times, Zipf picks."""
    rng = random.Random(SEED)
    weights = [1 / (k**ZIPF_S) for k in range(1, adapters + 1)]
    picks = rng.choices(range(adapters), weights=weights, k=requests)
    now, times = 0.0, []
    for _ in range(requests):
        now += rng.expovariate(rate)
        times.append(now)
    return list(zip(times, picks, strict=True))


async def stream_ttft(client: openai.AsyncOpenAI, model: str, since: float) -> float:
    """Send a streamed chat request; seconds from `since` to its first content chunk."""
    stream = await client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=16, temperature=0, stream=True
    )
    first = None
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - since
    if first is None:
        raise RuntimeError(f"{model} answered no text")
    return first


async def replay(
    setup: str,
    base_url: str,
    plan: list[tuple[float, str]],
    before_first: Callable[[str], Coroutine[Any, Any, None]] | None = None,
) -> Outcome:
    """Send `plan` ((send time, model) pairs) at its times; TTFT per request, cold = model's first.

    `before_first(model)`: awaited before a model's first request is sent, its time counted in that
    request's TTFT (vLLM's runtime adapter load); requests for the model wait for it.
    """
    outcome = Outcome(setup)
    seen: dict[str, asyncio.Task[None]] = {}
    async with openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT_S
    ) as client:

        async def one(at: float, model: str, start: float) -> tuple[str, bool, float | None]:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            sent = time.perf_counter()
            cold = model not in seen
            if cold:
                seen[model] = asyncio.create_task(before_first(model) if before_first else asyncio.sleep(0))
            try:
                await seen[model]
                return model, cold, await stream_ttft(client, model, sent)
            except Exception as exc:  # a failed request counts as one, with its reason kept
                outcome.errors.append(f"{model}: {type(exc).__name__}: {exc}"[:300])
                return model, cold, None

        start = time.perf_counter()
        outcome.rows = list(await asyncio.gather(*(one(at, model, start) for at, model in plan)))
        outcome.wall_s = time.perf_counter() - start
    return outcome


def count_loads(stack: Stack, seen_lines: int, names: set[str]) -> int:
    """Loads of any of `names` in the stack's console since line `seen_lines`."""
    lines = stack.console_log.read_text(errors="replace").splitlines()[seen_lines:]
    pattern = re.compile(r"loading (\S+) \(")
    return sum(1 for line in lines if (m := pattern.search(line)) and m[1] in names)


def console_lines(stack: Stack) -> int:
    return len(stack.console_log.read_text(errors="replace").splitlines())


def adapter_names(count: int) -> list[str]:
    return [f"ft-{n}" for n in range(1, count + 1)]


def folder_of(index: int, folders: list[Path]) -> Path:
    """Adapter `index`'s folder: the K distinct folders in turn."""
    return folders[index % len(folders)]


@dataclass
class Registration:
    """Adapters registered through the admin API: how many, in how long, and how long after the last
    one the worker's log said it knew them all (None: not waited for)."""

    count: int
    seconds: float
    known_after_s: float | None = None

    @property
    def rate(self) -> float | None:
        return self.count / self.seconds if self.seconds > 0 and self.count else None


@dataclass
class IdleCheck:
    """Redis commands/s of the idle stack with few and with many adapters registered, and the
    resident memory (KiB) of its front door and worker at each point."""

    before_count: int
    before_rate: float
    before_rss: dict[str, int | None]
    after_count: int = 0
    after_rate: float | None = None
    after_rss: dict[str, int | None] = field(default_factory=dict)
    registration: Registration | None = None


@dataclass
class SwitchboardRun:
    """What the adapters' stack gave; each part stays None when it did not run."""

    base_alone: Outcome | None = None
    lora: Outcome | None = None
    registration: Registration | None = None
    idle: IdleCheck | None = None


def worker_holds(stack: Stack, total: int) -> float:
    """Wait until the worker's log says it knows `total` registered adapters; seconds waited."""
    log = stack.workers[0].log_path
    assert log is not None
    needle = f"registered adapters: {total} (".encode()
    start = time.perf_counter()
    offset, carry = 0, b""

    def known() -> bool:
        nonlocal offset, carry
        with log.open("rb") as file:
            file.seek(offset)
            chunk = file.read()
        offset += len(chunk)
        text, carry = carry + chunk, (carry + chunk)[-len(needle) :]
        return needle in text

    stack.wait_until(known, timeout_s=KNOWN_TIMEOUT_S, what=f"the worker to know {total} registered adapters")
    return time.perf_counter() - start


def register(stack: Stack, entries: list[tuple[str, Path]], what: str, total: int) -> Registration:
    """Register `entries` (name, folder) one after another on the base; then wait until the worker
    knows `total` registered adapters in all."""
    start = time.perf_counter()
    with httpx.Client(base_url=stack.base_url, timeout=60.0) as client:
        for done, (name, path) in enumerate(entries, start=1):
            body = {"name": name, "base": BASE, "path": str(path), "keep_alive_s": REGISTERED_KEEP_ALIVE_S}
            reply = client.post("/admin/adapters", json=body)
            if reply.status_code != 201:
                raise RuntimeError(f"registering {name}: {reply.status_code} {reply.text[:300]}")
            if done % PROGRESS_EVERY == 0 or done == len(entries):
                elapsed = time.perf_counter() - start
                say(f"  {what}: {done}/{len(entries)} registered, {done / elapsed:.0f} registrations/s")
    registration = Registration(len(entries), time.perf_counter() - start)
    registration.known_after_s = worker_holds(stack, total)
    say(f"  the worker knew all {total} registered adapters {registration.known_after_s:.1f} s later")
    return registration


def unregister(stack: Stack, names: list[str], total: int) -> None:
    """Remove the registered adapters `names`; wait until the worker knows `total` are left."""
    start = time.perf_counter()
    with httpx.Client(base_url=stack.base_url, timeout=60.0) as client:
        for done, name in enumerate(names, start=1):
            reply = client.delete(f"/admin/adapters/{name}")
            if reply.status_code != 200:
                raise RuntimeError(f"removing {name}: {reply.status_code} {reply.text[:300]}")
            if done % (10 * PROGRESS_EVERY) == 0 or done == len(names):
                say(f"  {done}/{len(names)} removed, {done / (time.perf_counter() - start):.0f}/s")
    worker_holds(stack, total)


def redis_commands_per_s(redis_url: str, seconds: float) -> float:
    """Commands Redis processed per second over `seconds` (its `INFO stats` counter), ours left out."""
    with redis.Redis.from_url(redis_url) as client:
        first = int(client.info("stats")["total_commands_processed"])
        start = time.perf_counter()
        time.sleep(seconds)
        last = int(client.info("stats")["total_commands_processed"])
        elapsed = time.perf_counter() - start
    # The counter moves after a command runs: the first INFO is in `last`, the second in neither.
    return (last - first - 1) / elapsed


def rss_kib(pid: int) -> int | None:
    """A process's resident memory (VmRSS, KiB), or None when it cannot be read."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return int(found[1]) if found else None


def stack_rss(stack: Stack) -> dict[str, int | None]:
    """The front door's and the (first) worker's resident memory, KiB (their own processes only)."""
    return {"front door": rss_kib(stack.router.process.pid), "worker": rss_kib(stack.workers[0].process.pid)}


def idle_check(stack: Stack, folders: list[Path], registered: int, run: SwitchboardRun) -> IdleCheck:
    """With `registered` adapters registered already: top up to IDLE_BEFORE (`idle-{n}`), measure;
    register up to IDLE_TOTAL, wait IDLE_SETTLE_S, measure again. In `run.idle` from the first
    measurement on."""
    names = (f"idle-{n}" for n in range(1, IDLE_TOTAL + 1))
    first = [(next(names), folder_of(i, folders)) for i in range(max(0, IDLE_BEFORE - registered))]
    if first:
        register(stack, first, "idle check, before", registered + len(first))
    before_count = registered + len(first)
    say(f"idle check: Redis commands/s over {IDLE_WINDOW_S:g} s with {before_count} adapters registered")
    check = IdleCheck(before_count, redis_commands_per_s(stack.redis_url, IDLE_WINDOW_S), stack_rss(stack))
    run.idle = check
    say(f"  {check.before_rate:.1f} commands/s; RSS {rss_line(check.before_rss)}")
    more = max(0, IDLE_TOTAL - before_count)
    rest = [(next(names), folder_of(i, folders)) for i in range(len(first), len(first) + more)]
    check.registration = register(stack, rest, "idle check", before_count + len(rest))
    check.after_count = before_count + len(rest)
    time.sleep(IDLE_SETTLE_S)
    say(f"idle check: Redis commands/s over {IDLE_WINDOW_S:g} s with {check.after_count} adapters registered")
    check.after_rate = redis_commands_per_s(stack.redis_url, IDLE_WINDOW_S)
    check.after_rss = stack_rss(stack)
    say(f"  {check.after_rate:.1f} commands/s; RSS {rss_line(check.after_rss)}")
    return check


def rss_line(rss: dict[str, int | None]) -> str:
    return ", ".join(f"{name} {mib(kib)}" for name, kib in rss.items())


def mib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.0f} MiB"


def run_switchboard_adapters(
    demo: Path,
    folders: list[Path],
    count: int,
    schedule: list[tuple[float, int]],
    logs: Path,
    run: SwitchboardRun,
    *,
    registered: bool,
    idle: bool,
) -> None:
    """One stack, the base preloaded with `count` adapters on it (in its config, or registered through
    the admin API once the base is warm); the idle check if asked; then, with a schedule, the base
    alone and the adapters. Fills `run` as it goes (what ran stays there if a later part fails)."""
    names = adapter_names(count)
    entries = [(name, folder_of(i, folders)) for i, name in enumerate(names)]
    base = config_entry(demo, name=BASE, preload=True, lora={"max_adapters": min(count, 64)})
    models: list[dict[str, Any]] = [base]
    if not registered:
        models += [{"name": name, "base": BASE, "path": str(path)} for name, path in entries]
    config = {"worker": {"max_loaded_models": 2}, "models": models}
    say(f"starting Switchboard with the base{' alone' if registered else ' and its adapters'}")
    with running_stack(config, root=logs / "switchboard-adapters") as stack:
        stack.wait_serving(BASE)
        if registered:
            say(f"registering {count} adapters over {len(folders)} folders")
            run.registration = register(stack, entries, "adapters", count)
            say(f"  {num(run.registration.rate, 0)} registrations/s")
        own = count if registered else 0
        if idle:
            check = idle_check(stack, folders, own, run)
            idle_names = [f"idle-{n}" for n in range(1, check.after_count - own + 1)]
            if schedule and idle_names:
                say(f"removing the idle check's {len(idle_names)} adapters before the requests")
                unregister(stack, idle_names, own)
        if not schedule:
            return
        say(f"the base alone: {len(schedule)} requests")
        run.base_alone = asyncio.run(
            replay("one base alone", stack.base_url, [(t, BASE) for t, _ in schedule])
        )
        say(f"  {len(run.base_alone.errors)} errors")
        seen = console_lines(stack)
        say(f"adapters: {len(schedule)} requests over {count} adapters")
        setup = lora_setup(count, registered)
        lora = asyncio.run(replay(setup, stack.base_url, [(t, names[i]) for t, i in schedule]))
        lora.loads = count_loads(stack, seen, set(names))
        run.lora = lora
        say(f"  {len(lora.errors)} errors, {lora.loads} adapter loads")


def run_merged(merged: list[Path], schedule: list[tuple[float, int]], logs: Path) -> Outcome:
    """The fine-tunes as whole models, two loaded at a time, the requests for them."""
    names = [f"merged-{n}" for n in range(1, len(merged) + 1)]
    models = [config_entry(path, name=name) for name, path in zip(names, merged, strict=True)]
    config = {"worker": {"max_loaded_models": 2}, "models": models}
    plan = [(t, names[i]) for t, i in schedule if i < len(merged)]
    say(f"starting Switchboard with {len(merged)} merged models")
    with running_stack(config, root=logs / "switchboard-merged") as stack:
        seen = console_lines(stack)
        say(f"merged models: {len(plan)} requests")
        outcome = asyncio.run(replay(f"{len(merged)} merged models", stack.base_url, plan))
        outcome.loads = count_loads(stack, seen, set(names))
        say(f"  {len(outcome.errors)} errors, {outcome.loads} model loads")
    return outcome


def post_json(url: str, payload: dict[str, Any]) -> str:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as reply:
        return bytes(reply.read()).decode(errors="replace")


def run_vllm(
    demo: Path, folders: list[Path], count: int, schedule: list[tuple[float, int]], logs: Path
) -> Outcome:
    """vLLM's own server with LoRA enabled; each adapter loaded at runtime before its first request
    (under its own name, from its folder: the same name-to-folder mapping as Switchboard's)."""
    names = adapter_names(count)
    outcome = Outcome(f"vLLM's server, {count} adapters")
    flags = [*DEMO_ENGINE_FLAGS, "--enable-lora", "--max-lora-rank", "8", "--max-loras", "8"]
    flags += ["--max-cpu-loras", "64"]
    os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # spawn_vllm passes our environment on
    log_path = logs / "vllm-lora.log"
    say("starting vLLM's server with --enable-lora")
    with spawn_vllm(demo, log_path, served_name=BASE, engine_flags=flags) as (process, base_url):
        with contextlib.redirect_stdout(sys.stderr):  # its progress lines, not the report's
            wait_ready(f"{base_url}/v1/models", [process], [log_path], "vllm")
        loads = 0

        async def load(model: str) -> None:
            nonlocal loads
            path = str(folder_of(names.index(model), folders))
            body = {"lora_name": model, "lora_path": path}
            await asyncio.to_thread(post_json, f"{base_url}/v1/load_lora_adapter", body)
            loads += 1

        say(f"vLLM's server: {len(schedule)} requests over {count} adapters")
        outcome = asyncio.run(replay(outcome.setup, base_url, [(t, names[i]) for t, i in schedule], load))
        outcome.loads = loads
        say(f"  {len(outcome.errors)} errors, {loads} adapter loads")
    return outcome


def guarded(setup: str, part: Callable[[], Outcome]) -> Outcome:
    """Run one part; on failure, an Outcome that says it was skipped and why."""
    try:
        return part()
    except BaseException as exc:  # pytest.fail raises a BaseException; a skipped part must not end the run
        if isinstance(exc, KeyboardInterrupt):
            raise
        say(f"{setup}: skipped: {type(exc).__name__}: {exc}")
        return Outcome(setup, skipped=f"{type(exc).__name__}: {str(exc)[:300]}")


def pct(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile, or None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def report(outcomes: list[Outcome], base_alone: Outcome, lora: Outcome, merged: Outcome) -> str:
    lines = [
        "| setup | requests | requests/s | TTFT p50 warm | TTFT p99 warm | TTFT p50 cold | loads | errors |"
    ]
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    skipped = []
    for o in outcomes:
        if o.skipped:
            skipped.append(f"- {o.setup}: skipped ({o.skipped})")
            continue
        warm, cold = o.ttfts(False), o.ttfts(True)
        lines.append(
            f"| {o.setup} | {len(o.rows)} | {num(o.rate)} | {ms(pct(warm, 50))} | {ms(pct(warm, 99))} | "
            f"{ms(pct(cold, 50))} | {'-' if o.loads is None else o.loads} | {len(o.errors)} |"
        )
    cold_warm = ratio(pct(lora.ttfts(True), 50), pct(lora.ttfts(False), 50))
    vs_base = ratio(lora.rate, base_alone.rate)
    vs_merged = ratio(lora.rate, merged.rate)

    def verdict(value: float | None, ok: bool) -> str:
        return "n/a" if value is None else ("pass" if ok else "FAIL")

    lines += ["", "| ratio | value | target | verdict |", "|---|---:|---:|---|"]
    lines.append(
        f"| cold adapter TTFT p50 / warm TTFT p50 | {num(cold_warm)}x | ≤ 2x | "
        f"{verdict(cold_warm, cold_warm is not None and cold_warm <= 2)} |"
    )
    lines.append(
        f"| adapters req/s ÷ base alone req/s | {num(vs_base)} | ≥ 0.8 | "
        f"{verdict(vs_base, vs_base is not None and vs_base >= 0.8)} |"
    )
    lines.append(
        f"| adapters req/s ÷ merged req/s | {num(vs_merged)}x | ≥ 10x | "
        f"{verdict(vs_merged, vs_merged is not None and vs_merged >= 10)} |"
    )
    if skipped:
        lines += ["", *skipped]
    errors = [f"- {o.setup}: {e}" for o in outcomes for e in o.errors[:3]]
    if errors:
        lines += ["", "First errors per setup:", *errors]
    return "\n".join(lines)


def registration_report(run: SwitchboardRun, folders: int) -> str:
    """The admin API's registrations: the N adapters' and the idle check's."""
    lines = [
        "| registered (admin API, one after another) | adapters | folders | seconds | registrations/s "
        "| worker knew all after |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    parts = [("the adapters", run.registration)]
    if run.idle is not None:
        parts.append((f"the idle check's, up to {run.idle.after_count}", run.idle.registration))
    for what, done in parts:
        if done is not None:
            known = "-" if done.known_after_s is None else f"{done.known_after_s:.1f} s"
            lines.append(
                f"| {what} | {done.count} | {folders} | {done.seconds:.1f} | {num(done.rate, 0)} | {known} |"
            )
    return "\n".join(lines)


def idle_report(check: IdleCheck) -> str:
    """Redis commands/s and resident memory of the idle stack, few and many adapters registered."""
    lines = [
        f"| idle stack, no requests | {check.before_count} registered | {check.after_count} registered "
        "| ratio | target | verdict |",
        "|---|---:|---:|---:|---:|---|",
    ]
    commands = ratio(check.after_rate, check.before_rate)
    verdict = "n/a" if commands is None else ("pass" if commands <= IDLE_TARGET else "FAIL")
    lines.append(
        f"| Redis commands/s ({IDLE_WINDOW_S:g} s each) | {num(check.before_rate, 1)} | "
        f"{num(check.after_rate, 1)} | {num(commands)} | the same (≤ {IDLE_TARGET:g}) | {verdict} |"
    )
    for name, before in check.before_rss.items():
        after = check.after_rss.get(name)
        grown = ratio(None if after is None else float(after), None if before is None else float(before))
        lines.append(f"| {name} RSS | {mib(before)} | {mib(after)} | {num(grown)} | - | - |")
    return "\n".join(lines)


def lora_setup(count: int, registered: bool) -> str:
    return f"{count} adapters on one base{' (registered)' if registered else ''}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", type=int, default=10)
    parser.add_argument(
        "--distinct",
        type=int,
        default=None,
        help=f"adapter folders to build, adapter i on folder i %% K (default min(N, {MAX_DISTINCT}))",
    )
    parser.add_argument("--requests", type=int, default=60, help="0: no requests (with --idle-check)")
    parser.add_argument("--rate", type=float, default=4.0, help="Poisson arrivals, requests/s")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache/switchboard/bench-adapters")
    parser.add_argument("--skip-vllm", action="store_true", help="leave out vLLM's own server")
    parser.add_argument(
        "--registered", action="store_true", help="register the adapters through the admin API, not the TOML"
    )
    parser.add_argument(
        "--idle-check",
        action="store_true",
        help=f"Redis commands/s of the idle stack with {IDLE_BEFORE} and {IDLE_TOTAL} adapters registered",
    )
    args = parser.parse_args()
    n = args.adapters
    if n < 1 or args.requests < 0:
        parser.error("--adapters must be at least 1 and --requests at least 0")
    if args.requests == 0 and not (args.idle_check or args.registered):
        parser.error("--requests 0 leaves nothing to measure without --idle-check or --registered")
    distinct = min(n, MAX_DISTINCT if args.distinct is None else args.distinct)
    if distinct < 1:
        parser.error("--distinct must be at least 1")
    replayed = args.requests > 0
    say(f"building the demo model and {distinct} adapter folders under {args.cache}")
    demo = build_demo_model(args.cache / "demo")
    folders = [
        build_adapter(demo, args.cache / f"adapter-{seed}", seed=seed) for seed in range(1, distinct + 1)
    ]
    merged_count = min(distinct, MAX_MERGED)
    merged: list[Path] = []
    if replayed:
        say(f"building {merged_count} merged models")
        merged = [build_merged(demo, folders[i], args.cache / f"merged-{i + 1}") for i in range(merged_count)]
    schedule = arrivals(args.requests, args.rate, n)
    logs = Path(tempfile.mkdtemp(prefix="bench-adapters-"))
    say(f"logs: {logs}")

    run = SwitchboardRun()
    setup = lora_setup(n, args.registered)

    def switchboard_part() -> Outcome:
        run_switchboard_adapters(
            demo, folders, n, schedule, logs, run, registered=args.registered, idle=args.idle_check
        )
        return run.lora or Outcome(setup, skipped="--requests 0")

    lora = guarded(setup, switchboard_part)
    base_alone = run.base_alone or Outcome("one base alone", skipped=lora.skipped)
    outcomes = [lora]
    if replayed:
        merged_out = guarded(f"{merged_count} merged models", lambda: run_merged(merged, schedule, logs))
        if args.skip_vllm:
            vllm = Outcome(f"vLLM's server, {n} adapters", skipped="--skip-vllm")
        else:
            vllm = guarded(f"vLLM's server, {n} adapters", lambda: run_vllm(demo, folders, n, schedule, logs))
        outcomes = [base_alone, lora, merged_out, vllm]
    flags = f"--adapters {n}" + ("" if args.distinct is None else f" --distinct {args.distinct}")
    flags += f" --requests {args.requests}" + (f" --rate {args.rate:g}" if replayed else "")
    flags += " --registered" * args.registered + " --idle-check" * args.idle_check
    print(f"\n`bench/adapters.py {flags}`\n")
    sections = []
    if replayed:
        sections.append(report(outcomes, base_alone, lora, outcomes[2]))
    elif lora.skipped != "--requests 0":
        sections.append(f"- {lora.setup}: skipped ({lora.skipped})")
    if run.registration is not None or (run.idle is not None and run.idle.registration is not None):
        sections.append(registration_report(run, distinct))
    if run.idle is not None:
        sections.append(idle_report(run.idle))
    print("\n\n".join(sections))
    failed = any(
        o.errors or (o.skipped and o.skipped not in ("--skip-vllm", "--requests 0")) for o in outcomes
    )
    say(f"logs kept in {logs}" if failed else "done")
    if not failed:
        shutil.rmtree(logs, ignore_errors=True)


if __name__ == "__main__":
    main()
