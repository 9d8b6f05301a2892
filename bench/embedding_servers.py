"""The systems the embeddings benchmark compares, started and stopped on this machine.

Switchboard serves the demo embedder as a `kind = "embed"` model on one worker (bench/servers.py's
`run_stack`), with the batching settings it is given; vLLM's own OpenAI server serves the same
folder with its pooling runner, on the cores a Switchboard worker gives its engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
from embedding_load import embed_one, request_body
from servers import PROGRESS_EVERY_S, READY_TIMEOUT_S, Server, StartupError, run_stack, spawn_vllm, wait_ready

from switchboard.local.demo_pooling_models import pooling_config_entry
from switchboard.local.launcher import Launcher, LauncherError

MODEL = "bench-embedder"
# The command the issue names: vLLM's pooling runner on the same folder, float32, eager, 512 tokens.
VLLM_POOLING_FLAGS = (
    "--runner",
    "pooling",
    "--dtype",
    "float32",
    "--enforce-eager",
    "--max-model-len",
    "512",
)
# While the model loads, a request may wait; past this, ask again (and look at the processes).
ATTEMPT_TIMEOUT_S = 30.0


@contextlib.contextmanager
def run_vllm_pooling(model_dir: Path, log_dir: Path) -> Iterator[Server]:
    """vLLM's own OpenAI server with the pooling runner on `model_dir`, ready."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "vllm.log"
    with spawn_vllm(model_dir, log_path, served_name=MODEL, engine_flags=VLLM_POOLING_FLAGS) as (
        process,
        base_url,
    ):
        start_s = wait_ready(f"{base_url}/v1/models", [process], [log_path], "vllm")
        yield Server(base_url, start_s)


def embedder_config(model_dir: Path, batching: dict[str, Any]) -> dict[str, Any]:
    """The demo embedder as Switchboard's only model, preloaded, with these `batching` settings."""
    return {"models": [pooling_config_entry(model_dir, "embed", name=MODEL, preload=True, batching=batching)]}


@contextlib.contextmanager
def run_switchboard_embedder(model_dir: Path, log_dir: Path, batching: dict[str, Any]) -> Iterator[Server]:
    """A private Redis, one worker serving the demo embedder and the front door, once it embeds."""
    with run_stack(embedder_config(model_dir, batching), log_dir) as (launcher, server):
        warm_s = wait_embedding(launcher, server.base_url)
        yield Server(server.base_url, server.start_s + warm_s, server.redis_url)


def wait_embedding(launcher: Launcher, base_url: str) -> float:
    """Ask for one embedding until one comes back (the first may wait for the load); returns seconds.

    Raises StartupError when a component exits, when the front door refuses the request for good
    (a 4xx other than a timeout or a rate limit), or after READY_TIMEOUT_S.
    """
    started = time.monotonic()
    next_report = started + PROGRESS_EVERY_S
    while True:
        try:
            launcher.check()
        except LauncherError as exc:
            raise StartupError(f"switchboard: {exc}") from exc
        error = asyncio.run(_one_attempt(base_url))
        elapsed = time.monotonic() - started
        if error is None:
            return elapsed
        if error.startswith("HTTP 4") and not error.startswith(("HTTP 408", "HTTP 429")):
            raise StartupError(f"switchboard refused an embeddings request: {error}")
        if elapsed > READY_TIMEOUT_S:
            raise StartupError(f"switchboard: no embedding after {READY_TIMEOUT_S:g} s: {error}")
        if time.monotonic() >= next_report:
            print(f"    switchboard: waiting for {MODEL} to embed ({elapsed:.0f} s)", flush=True)
            next_report += PROGRESS_EVERY_S
        time.sleep(0.5)


async def _one_attempt(base_url: str) -> str | None:
    timeout = aiohttp.ClientTimeout(total=ATTEMPT_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        answer = await embed_one(session, f"{base_url}/v1/embeddings", request_body(MODEL, "Hello"))
    return answer.error
