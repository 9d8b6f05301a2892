"""The tables bench/model_sources.py prints: each system's cold first token against a local folder's,
the fetch and its rate, vLLM's own server on the same s3:// path, and the issue's targets."""

from __future__ import annotations

import statistics
from typing import Any

ROWS = (
    ("Switchboard, the store (s3://), empty node cache", "store", "local"),
    ("Switchboard, the node cache", "cache", "local"),
    ("Switchboard, a local folder", "local", "local"),
    ("vLLM's server, the store (s3://, runai_streamer)", "vllm_store", "vllm_local"),
    ("vLLM's server, a local folder", "vllm_local", "vllm_local"),
)


def report(results: dict[str, Any]) -> str:
    """The markdown the run prints and writes to its results file."""
    medians = {key: statistics.median(results[key]) for _, key, _ in ROWS if results[key]}
    fetched = [value for name, value in results["fetches"].items() if name.startswith("store-r")]
    fetch_s = statistics.median(seconds for _, seconds in fetched)
    rate = statistics.median(mb / seconds for mb, seconds in fetched)
    lines = [
        f"model: {results['model_mb']} MB in {results['files']} files; rounds: {len(results['store'])}; "
        "Switchboard's times on a running stack (request -> first token), vLLM's from process start",
        "",
        "| cold first token from | median s | all rounds | vs the same system's local folder |",
        "|---|---|---|---|",
    ]
    for label, key, base in ROWS:
        if key not in medians:
            lines.append(f"| {label} | not run | Run:ai's streamer is not installed | |")
            continue
        rounds = ", ".join(f"{v:.2f}" for v in results[key])
        lines.append(f"| {label} | {medians[key]:.2f} | {rounds} | {medians[key] / medians[base]:.2f}x |")
    lines += [
        "",
        f"Switchboard's fetch from the store: median {fetch_s:.2f} s at {rate:.0f} MB/s (loopback, moto)",
    ]
    loads = {key: [v for v in results[f"{key}_load"] if v is not None] for key in ("store", "cache", "local")}
    if all(loads.values()):
        lines.append(
            "Switchboard's load as the worker logs it (fetch + engine start, median): "
            + ", ".join(f"{key} {statistics.median(values):.1f} s" for key, values in loads.items())
        )
    lines += _vllm_lines(results, medians)
    lines += [
        f"8 concurrent cold requests to Switchboard: {results['burst_gets']} object GETs for "
        f"{results['files']} files; first tokens {min(results['burst_first_token_s']):.2f}-"
        f"{max(results['burst_first_token_s']):.2f} s",
        "",
        *_targets(results, medians, fetch_s),
    ]
    return "\n".join(lines)


def _vllm_lines(results: dict[str, Any], medians: dict[str, float]) -> list[str]:
    lines = []
    if results["vllm_store_gets"]:
        lines.append(
            f"vLLM's server from the store: {statistics.median(results['vllm_store_gets']):.0f} GETs and "
            f"{statistics.median(results['vllm_store_mb']):.0f} MB per start (median); it reads the weights "
            "from the store again at every start"
        )
        if "vllm_store" in medians:
            lines.append(
                f"vLLM's s3:// start minus its local-folder start: "
                f"{medians['vllm_store'] - medians['vllm_local']:.2f} s; Switchboard's store minus its "
                f"local folder: {medians['store'] - medians['local']:.2f} s"
            )
    store_w = [w for w in results.get("vllm_store_weights_s", []) if w is not None]
    local_w = [w for w in results.get("vllm_local_weights_s", []) if w is not None]
    if store_w and local_w:
        lines.append(
            f"vLLM's weights load, as its log says: from the store median {statistics.median(store_w):.0f} s "
            f"({results['model_mb'] / max(statistics.median(store_w), 1):.0f} MB/s or more; Run:ai's progress bar, "
            "whole seconds), "
            f"from a local folder {statistics.median(local_w):.2f} s"
        )
    lines.append(f"vLLM's server on s3:// with `--load-format safetensors`: {results['vllm_safetensors']}")
    return lines


def _targets(results: dict[str, Any], medians: dict[str, float], fetch_s: float) -> list[str]:
    store, cache, local = medians["store"], medians["cache"], medians["local"]
    budget = (fetch_s + local) * 1.1
    gets, files = results["burst_gets"], results["files"]
    return [
        "| target | measured | verdict |",
        "|---|---|---|",
        f"| node cache within 1.1x of a local folder | {cache / local:.2f}x | {_ok(cache <= 1.1 * local)} |",
        f"| store <= (fetch + local cold start) x 1.1 | {store:.2f} s vs {budget:.2f} s | {_ok(store <= budget)} |",
        f"| one fetch per host for 8 concurrent cold requests | {gets} GETs / {files} files | {_ok(gets == files)} |",
    ]


def _ok(passed: bool) -> str:
    return "pass" if passed else "FAIL"
