"""Model sources: the cold first token of a model whose files are in a bucket, in the node cache, or
in a local folder, side by side on one stack, with the download rate; and one download per host for
concurrent cold requests.

A random-weight Llama of about 230 MB (the demo model's tokenizer, larger layers) is uploaded to a
real S3 API on loopback (moto's server, tests/support/s3_store.py). One stack: Redis, two workers
sharing one node cache folder (one host), the front door; a first load on each worker, not counted. Each round, interleaved so that drifting
machine load hits each alike: a model at a fresh `s3://` prefix (an empty cache: fetch + engine
start), the same model again once it has left (its files cached), and the same files from a local
folder. Then eight concurrent first requests to another fresh prefix, counting the store's GETs.

    .venv/bin/python bench/model_sources.py              # or: make bench-sources
    .venv/bin/python bench/model_sources.py --rounds 1

The targets (the issue's): from the node cache within 1.1x of a local folder; from the store no
more than the fetch + the local cold start + 10 %; one fetch per host for any number of concurrent
cold requests. vLLM's own server given the same `s3://` path is not run here yet.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import openai  # noqa: E402
from openai.types.chat import ChatCompletionMessageParam  # noqa: E402

from switchboard.local.demo_model import build_demo_model, config_entry  # noqa: E402
from tests.support.s3_store import S3Store  # noqa: E402
from tests.support.stack import Stack, running_stack  # noqa: E402

BUCKET = "models"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me about the sea."}]
_FETCHED = re.compile(r"fetched the files of (\S+) \(([\d.]+) MB\) in ([\d.]+) s")


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def build_large_model(demo: Path, target: Path) -> Path:
    """The demo model's tokenizer and template with larger random layers (about 230 MB in float32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig.from_pretrained(demo)
    config.hidden_size, config.intermediate_size, config.num_hidden_layers = 768, 2048, 8
    config.num_attention_heads, config.num_key_value_heads = 12, 4
    torch.manual_seed(7)
    model = LlamaForCausalLM(config)
    target.mkdir(parents=True)
    model.save_pretrained(target, safe_serialization=True)
    for path in demo.iterdir():
        if path.is_file() and not (target / path.name).exists():
            shutil.copy2(path, target / path.name)
    return target


def first_token_s(stack: Stack, model: str) -> float:
    """Seconds from sending a streamed chat request to its first content chunk."""
    client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=600)
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=4,
        temperature=0,
        stream=True,
    )
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - started
    client.close()
    assert first is not None, f"{model} answered no text"
    return first


def admin(stack: Stack, model: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{stack.base_url}/admin/models/{model}", timeout=10) as response:
        payload: dict[str, Any] = json.loads(response.read())
        return payload


def wait_cold(stack: Stack, model: str) -> None:
    stack.wait_until(lambda: admin(stack, model)["state"] == "cold", timeout_s=120, what=f"{model} to leave")


def fetches(stack: Stack) -> dict[str, tuple[float, float]]:
    """Per model, the (MB, seconds) of its fetch, from the workers' logs."""
    found: dict[str, tuple[float, float]] = {}
    for path in stack.log_paths.values():
        for match in _FETCHED.finditer(path.read_text(errors="replace")):
            found[match[1]] = (float(match[2]), float(match[3]))
    return found


def run(rounds: int, root: Path) -> dict[str, Any]:
    demo = build_demo_model(root / "demo")
    say("building a 230 MB random-weight model")
    large = build_large_model(demo, root / "large")
    files = [p for p in large.rglob("*") if p.is_file()]
    size_mb = sum(p.stat().st_size for p in files) / 1e6
    results: dict[str, Any] = {"model_mb": round(size_mb, 1), "store": [], "cache": [], "local": []}
    with S3Store() as store:
        store.create_bucket(BUCKET)
        prefixes = [f"r{n}" for n in range(rounds)] + ["burst", "burst-warm"]
        for prefix in prefixes:
            store.upload_folder(large, BUCKET, prefix)
        engine = {**config_entry(large, name="x")["engine_args"]}
        models = [
            {"name": f"store-{p}", "path": f"s3://{BUCKET}/{p}", "engine_args": engine, "keep_alive_s": 0}
            for p in prefixes
        ] + [{"name": "local", "path": str(large), "engine_args": engine, "keep_alive_s": 0}]
        config = {
            "worker": {"max_loaded_models": 1, "model_cache_dir": str(root / "node-cache")},
            "models": models,
        }
        say("starting the stack: Redis, two workers sharing one node cache, the front door")
        with running_stack(config, root=root / "stack", workers=2, env=store.env()) as stack:
            # A worker's first engine start ever pays one-time costs (imports, compiled kernels) that
            # no later load does: a load from the local folder first, not counted, on each worker.
            say("warming up: a first load on each worker, not counted")
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda name: first_token_s(stack, name), ["local", "store-burst-warm"]))
            wait_cold(stack, "local")
            wait_cold(stack, "store-burst-warm")
            for n in range(rounds):
                say(f"round {n + 1}/{rounds}: from the store")
                results["store"].append(first_token_s(stack, f"store-r{n}"))
                wait_cold(stack, f"store-r{n}")
                say(f"round {n + 1}/{rounds}: from the node cache")
                results["cache"].append(first_token_s(stack, f"store-r{n}"))
                wait_cold(stack, f"store-r{n}")
                say(f"round {n + 1}/{rounds}: from a local folder")
                results["local"].append(first_token_s(stack, "local"))
                wait_cold(stack, "local")
            say("eight concurrent first requests to a cold model in the store")
            store.reset_counts()
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                burst = list(pool.map(lambda _: first_token_s(stack, "store-burst"), range(8)))
            results["burst_first_token_s"] = burst
            results["burst_gets"] = store.object_gets(BUCKET, "burst/")
            results["files"] = len(files)
            results["fetches"] = {name: list(value) for name, value in fetches(stack).items()}
    return results


def report(results: dict[str, Any]) -> str:
    store, cache, local = (statistics.median(results[k]) for k in ("store", "cache", "local"))
    fetched = [value for name, value in results["fetches"].items() if name.startswith("store-r")]
    fetch_s = statistics.median(seconds for _, seconds in fetched)
    rate = statistics.median(mb / seconds for mb, seconds in fetched)
    budget = (fetch_s + local) * 1.1
    lines = [
        f"model: {results['model_mb']} MB in {results['files']} files; rounds: {len(results['store'])}",
        "",
        "| cold first token from | median s | all rounds | vs local folder |",
        "|---|---|---|---|",
    ]
    for label, key, value in (("the store (s3://)", "store", store), ("the node cache", "cache", cache),
                              ("a local folder", "local", local)):  # fmt: skip
        rounds = ", ".join(f"{v:.2f}" for v in results[key])
        lines.append(f"| {label} | {value:.2f} | {rounds} | {value / local:.2f}x |")
    lines += [
        "",
        f"fetch from the store: median {fetch_s:.2f} s at {rate:.0f} MB/s (loopback, moto's server)",
        f"8 concurrent cold requests: {results['burst_gets']} object GETs for {results['files']} files; "
        f"first tokens {min(results['burst_first_token_s']):.2f}-{max(results['burst_first_token_s']):.2f} s",
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        f"| node cache within 1.1x of a local folder | {cache / local:.2f}x | {_ok(cache <= 1.1 * local)} |",
        f"| store <= (fetch + local cold start) x 1.1 | {store:.2f} s vs {budget:.2f} s | {_ok(store <= budget)} |",
        f"| one fetch per host for 8 concurrent cold requests | {results['burst_gets']} GETs / {results['files']} files"
        f" | {_ok(results['burst_gets'] == results['files'])} |",
    ]
    return "\n".join(lines)


def _ok(passed: bool) -> str:
    return "pass" if passed else "FAIL"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the report (markdown) here as well")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sources-") as tmp:
        results = run(args.rounds, Path(tmp))
    text = report(results)
    print("\n" + text)
    if args.out:
        args.out.write_text(
            f"# Model sources, {date.today()}\n\n`bench/model_sources.py --rounds {args.rounds}`\n\n{text}\n"
        )


if __name__ == "__main__":
    main()
