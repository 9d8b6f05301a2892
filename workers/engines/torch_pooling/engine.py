"""The PyTorch pooling runner as an engine: an embedder, a classifier or a cross-encoder reranker.

The model runs in a process of its own (`process`, the runner itself in
`runner`), pinned to the cores the worker placed it on with as many intra-op threads.
Triton's stub for the model sends it the batches Triton's dynamic batcher made, over a Unix socket
in a folder of the worker's own (`batch_socket`). The worker's side is this engine: it starts and
stops that process, starts it again when it ends unasked (killed, out of memory), says what the
model occupies and takes, and can hand it a batch itself (`pool`) from a thread of its own.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from switchboard.config import EngineProcess, ModelConfig
from switchboard.wire import ModelLimits
from workers.engines.base import Footprint, InvalidEngineRequest, PooledRow, PoolingEngine, PoolingRow
from workers.engines.model_files import DTYPE_BYTES, read_config, weights_bytes
from workers.engines.torch_pooling.process import PoolingProcess
from workers.engines.torch_pooling.runner import TOKEN_BUDGET, device
from workers.runtime.private_runtime import remove_runtime_dir, runtime_dir

logger = logging.getLogger(__name__)

# Float32 values per token of a pass alive at once, in hidden widths (a layer's query, key, value and
# output projections, the feed-forward's four-times-wider one, residuals), beside the attention scores.
ACTIVATION_WIDTHS = 12
# Jobs the worker may take at once for a pooling model, per row of its largest batch: enough for the
# batcher to fill a batch while the previous one computes.
JOBS_PER_BATCH_ROW = 2
# How long a pooling process may take to end when asked before it is killed.
STOP_TIMEOUT_S = 5.0


class TorchPoolingEngine(PoolingEngine):
    """One pooling model, run by PyTorch in a process of its own."""

    def __init__(
        self, model: ModelConfig, *, cpu_threads: str | None = None, engine_process: EngineProcess = "fork"
    ) -> None:
        super().__init__(model)
        self._cpu_threads = cpu_threads
        self._engine_process = engine_process
        self._process: PoolingProcess | None = None
        self._socket_dir: Path | None = None
        self._socket_lock = threading.Lock()
        # Hands the worker's own batches to the process off the event loop, one at a time.
        self._sender: ThreadPoolExecutor | None = None
        # Held while the process is replaced: by the watcher, or by a batch that found it ended.
        self._replacing = threading.Lock()
        self._stopping = False
        # Why the model can no longer compute: its process ended and could not be started again.
        self._failed: str | None = None

    @property
    def batch_socket(self) -> Path:
        """Where the model's process takes Triton's batches: a socket in a folder only this user opens."""
        # Asked for by the start and by Triton's bind at once, from two threads: one folder for both.
        with self._socket_lock:
            if self._socket_dir is None:
                self._socket_dir = runtime_dir("pooling")
            return self._socket_dir / "batches"

    # --- the Engine's life ------------------------------------------------------------------

    async def start(self) -> None:
        """Start the model's process; return once it has loaded the model and listens for batches."""
        self._stopping = False
        self._failed = None
        self._process = await asyncio.to_thread(self._launch)
        self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"pooling-{self.model.name}")
        threading.Thread(target=self._watch, name=f"pooling-watch-{self.model.name}", daemon=True).start()

    async def stop(self) -> None:
        """End the model's process, once a batch in progress has been answered."""
        self._stopping = True
        # The sender first: it may be starting the process again.
        sender, self._sender = self._sender, None
        if sender is not None:
            await asyncio.to_thread(sender.shutdown, wait=True)
        with self._replacing:
            process, self._process = self._process, None
        with self._socket_lock:
            socket_dir, self._socket_dir = self._socket_dir, None
        if process is not None:
            await asyncio.to_thread(process.stop, STOP_TIMEOUT_S)
        if socket_dir is not None:
            remove_runtime_dir(socket_dir)

    def _launch(self) -> PoolingProcess:
        return PoolingProcess.launch(
            self.model,
            cpu_threads=self._cpu_threads,
            start=self._engine_process,
            batch_socket=self.batch_socket,
        )

    def _watch(self) -> None:
        """On a thread of its own: start the process again whenever it ends unasked, so that Triton's
        next batch finds it (the batch it was computing failed with it; the next ones need not)."""
        while not self._stopping:
            process = self._process
            if process is None:
                return
            wait([process.sentinel])
            try:
                self._replace_if_ended(process)
            except Exception:
                return  # said why, and `ended` says it to the worker, which unloads the model

    def _replace_if_ended(self, process: PoolingProcess) -> PoolingProcess | None:
        """The process now serving the model: `process`'s replacement if it has ended."""
        with self._replacing:
            if self._stopping or self._process is not process or not process.exited:
                return self._process
            logger.error(
                "a pooling model's process ended; starting it again", extra={"model": self.model.name}
            )
            process.stop(STOP_TIMEOUT_S)
            try:
                self._process = self._launch()
            except Exception as exc:
                self._failed = f"the process of {self.model.name} ended and could not be started again: {exc}"
                logger.exception(
                    "could not start a pooling model's process again", extra={"model": self.model.name}
                )
                raise
            return self._process

    def ended(self) -> str | None:
        """Why the model can no longer compute: its process ended, and the one started in its place
        failed (the worker then unloads the model, and loads it afresh when asked); None while it can
        (a process that ends is started again, the batch it computed failing with it)."""
        return None if self._stopping else self._failed

    def _pool_in_process(self, rows: list[PoolingRow]) -> list[PooledRow | InvalidEngineRequest]:
        """On the sender's thread: the batch computed in the model's process, started again first
        when it has ended."""
        process = self._process
        if process is not None and process.exited:
            process = self._replace_if_ended(process)
        if process is None:
            raise RuntimeError(f"{self.model.name} is not started")
        return process.pool(rows)

    def process_ids(self) -> list[int]:
        """The model's own process, while started."""
        return [self.pid] if self.pid is not None else []

    @property
    def pid(self) -> int | None:
        """The model's process, while started."""
        return self._process.pid if self._process is not None else None

    def footprint(self) -> Footprint:
        """Started: the parameters' bytes and a largest pass's activations; before, the same from its files."""
        config = read_config(Path(self.model.path))
        if self._process is not None:
            loaded = self._process.loaded
            return Footprint(
                device=loaded.device, memory_bytes=loaded.memory_bytes + _activation_bytes(config)
            )
        dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
        as_float32 = weights_bytes(Path(self.model.path)) * 4 / DTYPE_BYTES.get(dtype, 4)
        return Footprint(device=device(), memory_bytes=int(as_float32) + _activation_bytes(config))

    def limits(self) -> ModelLimits | None:
        """The longest input, the vocabulary and the longest token, once loaded."""
        return self._process.loaded.limits if self._process is not None else None

    def max_sequences(self) -> int | None:
        """Jobs at once: two of the largest batch's rows each, so that the batcher has the next batch
        waiting while one computes."""
        return JOBS_PER_BATCH_ROW * self.model.batching.max_batch_size

    def labels(self) -> tuple[str, ...]:
        """A classifier's label names, in the order of its probabilities."""
        return self._process.loaded.labels if self._process is not None else ()

    # --- pooling ----------------------------------------------------------------------------

    async def pool(self, rows: Sequence[PoolingRow]) -> list[PooledRow | InvalidEngineRequest]:
        """Each row's answer, or its refusal, computed in the model's process."""
        if self._process is None or self._sender is None:
            raise RuntimeError(f"{self.model.name} is not started")
        return await asyncio.wrap_future(self._sender.submit(self._pool_in_process, list(rows)))


def _activation_bytes(config: dict[str, Any]) -> int:
    """What the largest pass's activations take: TOKEN_BUDGET tokens through the widest layer, and
    their attention scores over the longest input."""
    width = int(config.get("hidden_size") or 768)
    heads = int(config.get("num_attention_heads") or 12)
    positions = int(config.get("max_position_embeddings") or 512)
    return TOKEN_BUDGET * 4 * (width * ACTIVATION_WIDTHS + 2 * heads * positions)
