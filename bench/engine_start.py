"""Cold load of one model: how long from "load it" to an answer, and what unloading gives back.

Each run is a fresh Python process standing in for a worker: it prepares what the variant prepares
at boot (imports, fork server), then measures, from the moment the load is requested, the seconds
until the engine is ready and until the first token of a first request, decode speed (three
128-token requests), and the unload: its seconds and the memory of the process tree before and
after. Variants alternate within each round (each round starting with another one), so drifting
machine load hits all of them; the 1-minute load average before each run is in the JSON.

    .venv/bin/python bench/engine_start.py                 # every variant, 3 rounds
    .venv/bin/python bench/engine_start.py --rounds 1 --variants mp0,mp0-import,fork
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

RESULT_MARK = "ENGINE_START_RESULT "
MIB = 1024**2
CPU_THREADS = "0-0"  # the core a 2-core worker gives its engine

# name -> (what it stands for, environment, how the engine starts, what runs at boot)
VARIANTS: dict[str, dict[str, Any]] = {
    "before": {
        "about": "the engine as it was: 2 processes, vLLM's own pinning, no bytecode, new cache",
        "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_OMP_THREADS_BIND": CPU_THREADS},
        "no_bytecode": True,
        "fresh_cache": True,
        "cpu_threads": None,
    },
    "bytecode": {
        "about": "+ bytecode compiled at install",
        "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_OMP_THREADS_BIND": CPU_THREADS},
        "fresh_cache": True,
        "cpu_threads": None,
    },
    "cache": {
        "about": "+ persistent VLLM_CACHE_ROOT",
        "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_OMP_THREADS_BIND": CPU_THREADS},
        "cpu_threads": None,
    },
    "mp0": {
        "about": "+ one engine process, pinned through OMP_* at spawn",
        "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    },
    "mp0-import": {
        "about": "+ import_runtime() at worker boot (the product default)",
        "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        "import_runtime": True,
    },
    "fork": {
        "about": "+ EngineCore forked from the fork server started at boot",
        "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        "import_runtime": True,
        "engine_process": "fork",
    },
}


# --- one run, in its own process -------------------------------------------------------------------


async def measure_one(variant: dict[str, Any], model_dir: str) -> dict[str, Any]:
    """Boot, load, generate, unload; the measurements of this run."""
    from switchboard.config import ModelConfig
    from switchboard.wire import SamplingParams
    from workers.engines.base import EngineRequest
    from workers.engines.vllm import VllmEngine, import_runtime

    result: dict[str, Any] = {"boot_s": 0.0, "fork_server_s": None}
    booted = time.monotonic()
    if variant.get("engine_process") == "fork":
        from workers.engines import fork_server

        result["fork_server_s"] = fork_server.start_fork_server()
    if variant.get("import_runtime"):
        import_runtime()
    result["boot_s"] = time.monotonic() - booted
    model = ModelConfig(
        name="demo",
        path=model_dir,
        engine_args={"max_model_len": 256, "dtype": "float32", "enforce_eager": True},
    )
    engine = VllmEngine(
        model,
        cpu_threads=variant.get("cpu_threads", CPU_THREADS),
        cpu_kvcache_gib=1,
        engine_process=variant.get("engine_process", "spawn"),
    )
    requested = time.monotonic()
    await engine.start()
    result["ready_s"] = time.monotonic() - requested
    decode: list[float] = []
    for index in range(4):
        sampling = SamplingParams(max_tokens=128, temperature=0.0, seed=0)
        request = EngineRequest(request_id=f"r{index}", sampling=sampling, prompt="Tell me a story.")
        first_at = last_at = 0.0
        tokens = 0
        async for delta in engine.generate(request):
            last_at = time.monotonic()
            if not first_at and delta.completion_tokens:
                first_at = last_at
            tokens = delta.completion_tokens
        if index == 0:
            result["first_token_s"] = first_at - requested
        elif tokens > 1:
            decode.append((tokens - 1) / (last_at - first_at))
    result["decode_tok_s"] = statistics.median(decode)
    result["engine_processes"] = len(_tree(engine._engine_pids))
    result["footprint_mib"] = engine.footprint().memory_bytes / MIB
    before = _tree_memory()
    engine_pids = [p.pid for p in _tree(engine._engine_pids)]
    unload_started = time.monotonic()
    await engine.stop()
    result["unload_s"] = time.monotonic() - unload_started
    after = _tree_memory()
    result["engine_pids_left"] = [pid for pid in engine_pids if psutil.pid_exists(pid)]
    result.update({f"{k}_before_mib": v for k, v in before.items()})
    result.update({f"{k}_after_mib": v for k, v in after.items()})
    return result


def _tree(pids: list[int]) -> list[psutil.Process]:
    found: list[psutil.Process] = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            found += [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
    return found


def _tree_memory() -> dict[str, float]:
    """Resident and proportional memory of this process and everything below it (MiB)."""
    rss = pss = 0
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            info = process.memory_full_info()
        except psutil.Error:
            continue
        rss += info.rss
        pss += info.pss
    return {"rss": rss / MIB, "pss": pss / MIB}


# --- the rounds, in the parent -------------------------------------------------------------------


def run_variant(name: str, model_dir: Path, work: Path, round_no: int) -> dict[str, Any]:
    """One run of one variant in a fresh interpreter; its measurements (or its error)."""
    variant = VARIANTS[name]
    env = {**os.environ, **variant["env"], "VLLM_CPU_KVCACHE_SPACE": "1"}
    env["VLLM_CACHE_ROOT"] = str(work / "vllm-cache")
    if variant.get("fresh_cache"):
        env["VLLM_CACHE_ROOT"] = tempfile.mkdtemp(prefix=f"cache-{name}-", dir=work)
    if variant.get("no_bytecode"):
        # Python looks for bytecode only under an empty folder: every module compiles from source.
        env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="pycache-", dir=work)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    command = [sys.executable, __file__, "--one", name, "--model", str(model_dir)]
    log = work / f"{name}-{round_no}.log"
    with log.open("w") as out:
        done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=out, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return dict(json.loads(line[len(RESULT_MARK) :]))
    return {"error": f"exit code {done.returncode}; see {log}"}


def summary_rows(results: dict[str, list[dict[str, Any]]]) -> list[list[str]]:
    """One row per variant: medians over its successful runs."""
    rows = []
    for name, runs in results.items():
        ok = [r for r in runs if "error" not in r]
        if not ok:
            rows.append([name, "failed", *[""] * 9])
            continue

        def med(key: str, runs: list[dict[str, Any]] = ok) -> float:
            return statistics.median(float(r[key]) for r in runs if r.get(key) is not None)

        left = sum(len(r["engine_pids_left"]) for r in ok)
        rows.append(
            [
                name,
                f"{len(ok)}/{len(runs)}",
                f"{med('boot_s'):.1f}",
                f"{med('ready_s'):.2f}",
                f"{med('first_token_s'):.2f}",
                f"{med('unload_s'):.2f}",
                f"{med('decode_tok_s'):.0f}",
                f"{med('engine_processes'):.0f}",
                f"{med('rss_before_mib'):.0f} → {med('rss_after_mib'):.0f}",
                f"{med('pss_before_mib') - med('pss_after_mib'):.0f}",
                str(left),
            ]
        )
    return rows


HEADER = [
    "variant",
    "ok",
    "boot s",
    "ready s",
    "1st token s",
    "unload s",
    "decode tok/s",
    "engine procs",
    "tree RSS MiB before → after unload",
    "PSS returned MiB",
    "engine procs left",
]


def print_table(rows: list[list[str]]) -> None:
    """A plain-text table, columns aligned."""
    widths = [max(len(row[i]) for row in [HEADER, *rows]) for i in range(len(HEADER))]
    for row in [HEADER, ["-" * w for w in widths], *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)), flush=True)


def main() -> int:
    """Run the rounds and print the table; or, with --one, a single run."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, of {list(VARIANTS)}"
    )
    parser.add_argument("--json", type=Path, help="also write every run's measurements here")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        result = asyncio.run(measure_one(VARIANTS[args.one], args.model))
        print(RESULT_MARK + json.dumps(result), flush=True)
        return 0

    names = [name.strip() for name in args.variants.split(",") if name.strip()]
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    work = Path(tempfile.mkdtemp(prefix="engine-start-"))
    model_dir = _build_model(work / "demo-model")
    print(f"model in {model_dir}; logs in {work}", flush=True)
    # Fill the persistent cache once, as an earlier load on this machine would have.
    print("warm-up run (fills the persistent vLLM cache) ...", flush=True)
    run_variant("mp0", model_dir, work, 0)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for round_no in range(1, args.rounds + 1):
        # Each round starts with another variant, so that none always runs after the same one.
        shift = (round_no - 1) % len(names)
        for name in names[shift:] + names[:shift]:
            load_1m = os.getloadavg()[0]
            result = run_variant(name, model_dir, work, round_no)
            result["load_1m_before"] = load_1m
            results[name].append(result)
            shown = {k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()}
            print(f"[round {round_no}] {name}: {shown}", flush=True)
    print()
    for name in names:
        print(f"{name:11} {VARIANTS[name]['about']}")
    print()
    print_table(summary_rows(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def _build_model(target: Path) -> Path:
    try:
        from switchboard.local.demo_model import build_demo_model
    except ImportError:  # before the move to switchboard.local
        from switchboard.demo_model import build_demo_model  # type: ignore[no-redef]
    return Path(build_demo_model(target))


if __name__ == "__main__":
    sys.exit(main())
