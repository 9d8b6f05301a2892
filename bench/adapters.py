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


def run_switchboard_adapters(
    demo: Path, adapters: list[Path], schedule: list[tuple[float, int]], logs: Path
) -> tuple[Outcome, Outcome]:
    """One stack, the base preloaded with the adapters on it: the base alone, then the adapters."""
    names = [f"ft-{n}" for n in range(1, len(adapters) + 1)]
    base = config_entry(demo, name=BASE, preload=True, lora={"max_adapters": min(len(adapters), 64)})
    models: list[dict[str, Any]] = [base]
    models += [
        {"name": name, "base": BASE, "path": str(path)} for name, path in zip(names, adapters, strict=True)
    ]
    config = {"worker": {"max_loaded_models": 2}, "models": models}
    say("starting Switchboard with the base and its adapters")
    with running_stack(config, root=logs / "switchboard-adapters") as stack:
        stack.wait_serving(BASE)
        say(f"the base alone: {len(schedule)} requests")
        base_alone = asyncio.run(replay("one base alone", stack.base_url, [(t, BASE) for t, _ in schedule]))
        say(f"  {len(base_alone.errors)} errors")
        seen = console_lines(stack)
        say(f"adapters: {len(schedule)} requests over {len(adapters)} adapters")
        lora = asyncio.run(
            replay(
                f"{len(adapters)} adapters on one base", stack.base_url, [(t, names[i]) for t, i in schedule]
            )
        )
        lora.loads = count_loads(stack, seen, set(names))
        say(f"  {len(lora.errors)} errors, {lora.loads} adapter loads")
    return base_alone, lora


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


def run_vllm(demo: Path, adapters: list[Path], schedule: list[tuple[float, int]], logs: Path) -> Outcome:
    """vLLM's own server with LoRA enabled; each adapter loaded at runtime before its first request."""
    names = [f"ft-{n}" for n in range(1, len(adapters) + 1)]
    outcome = Outcome(f"vLLM's server, {len(adapters)} adapters")
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
            path = str(adapters[names.index(model)])
            body = {"lora_name": model, "lora_path": path}
            await asyncio.to_thread(post_json, f"{base_url}/v1/load_lora_adapter", body)
            loads += 1

        say(f"vLLM's server: {len(schedule)} requests over {len(adapters)} adapters")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", type=int, default=10)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--rate", type=float, default=4.0, help="Poisson arrivals, requests/s")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache/switchboard/bench-adapters")
    parser.add_argument("--skip-vllm", action="store_true", help="leave out vLLM's own server")
    args = parser.parse_args()
    n = args.adapters
    say(f"building the demo model and {n} adapters under {args.cache}")
    demo = build_demo_model(args.cache / "demo")
    adapters = [build_adapter(demo, args.cache / f"adapter-{seed}", seed=seed) for seed in range(1, n + 1)]
    merged_count = min(n, MAX_MERGED)
    say(f"building {merged_count} merged models")
    merged = [build_merged(demo, adapters[i], args.cache / f"merged-{i + 1}") for i in range(merged_count)]
    schedule = arrivals(args.requests, args.rate, n)
    logs = Path(tempfile.mkdtemp(prefix="bench-adapters-"))
    say(f"logs: {logs}")

    pair: list[Outcome] = []

    def switchboard_part() -> Outcome:
        pair.extend(run_switchboard_adapters(demo, adapters, schedule, logs))
        return pair[1]

    lora = guarded(f"{n} adapters on one base", switchboard_part)
    base_alone = pair[0] if pair else Outcome("one base alone", skipped=lora.skipped)
    merged_out = guarded(f"{merged_count} merged models", lambda: run_merged(merged, schedule, logs))
    if args.skip_vllm:
        vllm = Outcome(f"vLLM's server, {n} adapters", skipped="--skip-vllm")
    else:
        vllm = guarded(f"vLLM's server, {n} adapters", lambda: run_vllm(demo, adapters, schedule, logs))
    outcomes = [base_alone, lora, merged_out, vllm]
    print(f"\n`bench/adapters.py --adapters {n} --requests {args.requests} --rate {args.rate:g}`\n")
    print(report(outcomes, base_alone, lora, merged_out))
    say(f"logs kept in {logs}" if any(o.errors or o.skipped for o in outcomes) else "done")
    if not any(o.errors or o.skipped for o in outcomes):
        shutil.rmtree(logs, ignore_errors=True)


if __name__ == "__main__":
    main()
