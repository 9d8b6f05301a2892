"""Where each model held on this worker computes, and how much memory each is expected to take.

CPU shares: the compute cores are split into `max_loaded_models` shares, and a new engine takes a
share no other held model computes on (`cpu_placement` pins it there). Footprints: what the
controller counts a model as occupying before it is held here: declared in its configuration,
else measured on this kind of worker, else the engine's own estimate made at worker start.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Iterable

from switchboard.config import ModelConfig, WorkerConfig
from workers.runtime.cpu_placement import (
    available_cores,
    compute_cores,
    engine_threads_bind,
    keep_off_compute_cores,
)

logger = logging.getLogger(__name__)


class Placement:
    """The core shares of the held models, and the footprints estimated at start."""

    def __init__(self, worker: WorkerConfig, *, place_process: bool) -> None:
        """`place_process`: move this process's own threads off the compute cores (before Triton
        and the engine runtime start: they inherit it)."""
        cores = available_cores()
        self._cores = compute_cores(cores, worker.reserved_cores)
        if place_process:
            keep_off_compute_cores(cores, worker.reserved_cores)
        self._shares = worker.max_loaded_models
        self._share_of: dict[str, int] = {}
        self._estimated: dict[str, int] = {}

    def cpu_threads(self, model: str, held: Iterable[str]) -> str:
        """The cores a new engine for `model` computes on: a share none of the `held` models uses."""
        taken = {self._share_of[name] for name in held if name != model and name in self._share_of}
        share = next(n for n in range(self._shares + 1) if n not in taken) % self._shares
        self._share_of[model] = share
        return engine_threads_bind(self._cores, share, self._shares)

    def estimate(self, model: ModelConfig, footprint_bytes: Callable[[], int]) -> None:
        """Keep the engine's own estimate of `model`'s footprint (0 if it cannot tell); blocking."""
        try:
            self._estimated[model.name] = footprint_bytes()
        except Exception:
            logger.warning("cannot estimate the footprint", exc_info=True, extra={"model": model.name})
            self._estimated[model.name] = 0

    def expected_footprint(self, model: ModelConfig, measured: list[bytes]) -> int:
        """Declared, else measured on this kind of worker, else the engine's own estimate."""
        if model.footprint_gib is not None:
            return int(model.footprint_gib * 1024**3)
        if measured:
            return int(statistics.median(float(value) for value in measured))
        return self._estimated.get(model.name, 0)  # 0 (unknown) until estimated at boot
