"""Model sources: the cold first token of a model whose files are in a bucket, in the node cache, or
in a local folder, side by side on one stack, with the download rate; and one download per host for
concurrent cold requests.

A random-weight Llama of about 200 MB (the demo model's tokenizer, larger layers) is uploaded to a
real S3 API on loopback (moto's server, tests/support/s3_store.py). One stack: Redis, two workers
sharing one node cache folder (one host), the front door; a first load on each worker, not counted.
Each round, so that drifting machine load hits every system alike: Switchboard given the model at a
fresh `s3://` prefix (an empty cache: fetch + engine start), the same model again once it has left
(its files cached), and the same files from a local folder, in an order turned every round; then
vLLM's own OpenAI server, started fresh, given the model at another fresh `s3://` prefix (vLLM 0.32
reads an object store only through Run:ai's model streamer: its `auto` loader becomes
`--load-format runai_streamer`) and the local folder, each timed from process start to first token
as bench/cold_start.py does. Then eight concurrent first requests to another fresh prefix, counting
the store's GETs, and once what vLLM's server says to `--load-format safetensors` on s3://. Raw
results and every log go to bench/results/model_sources-<date>.json and the folder beside it.

    .venv/bin/python bench/model_sources.py              # or: make bench-sources
    .venv/bin/python bench/model_sources.py --rounds 1

The targets (the issue's): from the node cache within 1.1x of a local folder; from the store no
more than the fetch + the local cold start + 10 %; one fetch per host for any number of concurrent
cold requests.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from datetime import date
from pathlib import Path
from typing import Any, cast

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import openai  # noqa: E402
from model_sources_report import report  # noqa: E402
from openai.types.chat import ChatCompletionMessageParam  # noqa: E402
from servers import DEMO_ENGINE_FLAGS, spawn_vllm  # noqa: E402

from switchboard.local.demo_model import build_demo_model, config_entry  # noqa: E402
from tests.support.s3_store import S3Store  # noqa: E402
from tests.support.stack import Stack, running_stack  # noqa: E402

BUCKET = "models"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me about the sea."}]
# Switchboard's order within a round, turned every round so that no source always comes right after
# vLLM's servers (the node cache only after the store: the store's fetch fills it).
ORDERS = (("store", "cache", "local"), ("local", "store", "cache"), ("store", "local", "cache"))
LABELS = {"store": "the store", "cache": "the node cache", "local": "a local folder"}
SETTLE_S = 5.0
# vLLM's own words for how long its weights took: Run:ai's progress bar (elapsed mm:ss), the default loader's line.
_STREAMED = re.compile(
    r"Loading safetensors using Runai Model Streamer: 100% Completed \| \d+/\d+ \[(\d+):(\d+)<"
)
_LOADED = re.compile(r"Loading weights took ([\d.]+) seconds")
_FETCHED = re.compile(r"fetched the files of (\S+) \(([\d.]+) MB\) in ([\d.]+) s")


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def build_large_model(demo: Path, target: Path) -> Path:
    """The demo model's tokenizer and template with larger random layers (about 200 MB in float32)."""
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
    """Seconds from sending a streamed chat request to Switchboard to its first content chunk."""
    client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=600)
    try:
        return stream_first_token(client, model, time.perf_counter())
    finally:
        client.close()


def stream_first_token(client: openai.OpenAI, model: str, since: float) -> float:
    """Send a streamed chat request; seconds from `since` to its first content chunk."""
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
            first = time.perf_counter() - since
    assert first is not None, f"{model} answered no text"
    return first


def timed_first_token(stack: Stack, model: str, results: dict[str, Any], key: str) -> None:
    """The first token of `model` under results[key], and the worker's own load time for it (its
    console line "<model> is warm after N s") under results[key + "_load"]."""
    seen = len(stack.console_log.read_text(errors="replace").splitlines())
    results[key].append(first_token_s(stack, model))
    new_lines = stack.console_log.read_text(errors="replace").splitlines()[seen:]
    loads = [
        match[1] for line in new_lines if (match := re.search(rf"\b{model} is warm after ([\d.]+) s", line))
    ]
    results[key + "_load"].append(float(loads[-1]) if loads else None)


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


def runai_installed() -> bool:
    return importlib.util.find_spec("runai_model_streamer") is not None


def vllm_first_token_s(model: str, log_path: Path, store_env: dict[str, str], flags: list[str]) -> float:
    """vLLM's own server started fresh on `model` (a folder or an s3:// path): seconds from process
    start to the first token of its first streamed chat request (sent until the server listens)."""
    # spawn_vllm passes this process's environment on: the store's credentials and endpoint, and a
    # fresh folder for the config files vLLM pulls from the store (it would reuse them otherwise).
    os.environ.update(store_env)
    os.environ["VLLM_ASSETS_CACHE"] = str(log_path.with_suffix(".assets"))
    started = time.perf_counter()
    # spawn_vllm puts str(model_dir) on the command line: an s3:// URL goes as it is (a Path would
    # fold its "//" into one).
    flags = [*DEMO_ENGINE_FLAGS, *flags]
    with spawn_vllm(cast(Path, model), log_path, served_name="large", engine_flags=flags) as (
        process,
        base_url,
    ):
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=600)
        while time.perf_counter() - started < 600:
            if process.poll() is not None:
                raise RuntimeError(f"vLLM's server exited with code {process.returncode}; see {log_path}")
            try:
                return stream_first_token(client, "large", started)
            except openai.APIConnectionError:  # not listening yet
                time.sleep(0.25)
    raise RuntimeError(f"vLLM's server did not answer within 600 s; see {log_path}")


def vllm_refusal(model: str, log_path: Path, store_env: dict[str, str], flags: list[str]) -> str:
    """What vLLM's server says when it stops at start on `model` with `flags` (its last error line)."""
    try:
        seconds = vllm_first_token_s(model, log_path, store_env, flags)
    except RuntimeError:
        lines = log_path.read_text(errors="replace").splitlines()
        errors = [line for line in lines if "Value error" in line] or [
            line for line in lines if "Error" in line
        ]
        return errors[-1].strip() if errors else f"exited; see {log_path}"
    return f"served it: first token {seconds:.2f} s after process start"


def vllm_weights_s(log_path: Path) -> float | None:
    """Seconds vLLM's server spent loading weights, as its log says (whole seconds for Run:ai's bar)."""
    text = log_path.read_text(errors="replace")
    if streamed := _STREAMED.search(text):
        return int(streamed[1]) * 60 + int(streamed[2])
    loaded = _LOADED.search(text)
    return float(loaded[1]) if loaded else None


def run(rounds: int, root: Path, logs: Path) -> dict[str, Any]:
    demo = build_demo_model(root / "demo")
    say("building a 200 MB random-weight model")
    large = build_large_model(demo, root / "large")
    files = [p for p in large.rglob("*") if p.is_file()]
    size_mb = sum(p.stat().st_size for p in files) / 1e6
    systems = ("store", "cache", "local", "vllm_store", "vllm_local")
    results: dict[str, Any] = {"model_mb": round(size_mb, 1), **{key: [] for key in systems}}
    results["runai_streamer"] = runai_installed()
    for key in (
        "store_load",
        "cache_load",
        "local_load",
        "vllm_store_gets",
        "vllm_store_mb",
        "vllm_store_weights_s",
        "vllm_local_weights_s",
    ):
        results[key] = []
    with S3Store() as store:
        store.create_bucket(BUCKET)
        prefixes = [f"r{n}" for n in range(rounds)] + ["burst", "burst-warm"]
        for prefix in [*prefixes, *(f"v{n}" for n in range(rounds)), "refused"]:
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
        with running_stack(config, root=logs / "stack", workers=2, env=store.env()) as stack:
            # A worker's first engine start ever pays one-time costs (imports, compiled kernels) that
            # no later load does: a load from the local folder first, not counted, on each worker.
            say("warming up: a first load on each worker, not counted")
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda name: first_token_s(stack, name), ["local", "store-burst-warm"]))
            wait_cold(stack, "local")
            wait_cold(stack, "store-burst-warm")
            for n in range(rounds):
                for key in ORDERS[n % len(ORDERS)]:
                    model = "local" if key == "local" else f"store-r{n}"
                    say(f"round {n + 1}/{rounds}: Switchboard from {LABELS[key]}")
                    timed_first_token(stack, model, results, key)
                    wait_cold(stack, model)
                time.sleep(SETTLE_S)
                vllm_round(n, rounds, large, logs, store, results)
                time.sleep(SETTLE_S)  # the machine calms down after a vLLM server's exit
            say("eight concurrent first requests to a cold model in the store")
            store.reset_counts()
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                burst = list(pool.map(lambda _: first_token_s(stack, "store-burst"), range(8)))
            results["burst_first_token_s"] = burst
            results["burst_gets"] = store.object_gets(BUCKET, "burst/")
            results["files"] = len(files)
            results["fetches"] = {name: list(value) for name, value in fetches(stack).items()}
            say("vLLM's server on s3:// with --load-format safetensors")
            results["vllm_safetensors"] = vllm_refusal(
                f"s3://{BUCKET}/refused",
                logs / "vllm-refused.log",
                store.env(),
                ["--load-format", "safetensors"],
            )
    return results


def vllm_round(n: int, rounds: int, large: Path, logs: Path, store: S3Store, results: dict[str, Any]) -> None:
    """vLLM's own server, started fresh, from a fresh s3:// prefix (when Run:ai's streamer is
    installed) and from the local folder; the store's GETs and bytes for the s3:// start."""
    if results["runai_streamer"]:
        say(f"round {n + 1}/{rounds}: vLLM's server from the store (runai_streamer)")
        store.reset_counts()
        model = f"s3://{BUCKET}/v{n}"
        log_path = logs / f"vllm-store-{n}.log"
        results["vllm_store"].append(vllm_first_token_s(model, log_path, store.env(), []))
        results["vllm_store_weights_s"].append(vllm_weights_s(log_path))
        results["vllm_store_gets"].append(store.object_gets(BUCKET, f"v{n}/"))
        results["vllm_store_mb"].append(round(store.object_bytes(BUCKET, f"v{n}/") / 1e6, 1))
    say(f"round {n + 1}/{rounds}: vLLM's server from a local folder")
    log_path = logs / f"vllm-local-{n}.log"
    results["vllm_local"].append(vllm_first_token_s(str(large), log_path, {}, []))
    results["vllm_local_weights_s"].append(vllm_weights_s(log_path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the report (markdown) here as well")
    args = parser.parse_args()
    raw = REPO / "bench" / "results" / f"model_sources-{date.today()}.json"
    logs = raw.with_suffix("")  # vLLM's server logs, beside the raw results
    shutil.rmtree(logs, ignore_errors=True)  # an earlier run's of the same day
    logs.mkdir(parents=True)
    say(f"logs of the stack and of vLLM's servers: {logs}")
    with tempfile.TemporaryDirectory(prefix="bench-sources-") as tmp:
        results = run(args.rounds, Path(tmp), logs)
    raw.write_text(json.dumps(results, indent=2) + "\n")
    text = report(results)
    print("\n" + text)
    if args.out:
        args.out.write_text(
            f"# Model sources, {date.today()}\n\n`bench/model_sources.py --rounds {args.rounds}`\n\n{text}\n"
        )


if __name__ == "__main__":
    main()
