"""Which of a router model's targets would answer warm for a caller, read while the router decides
(`router.routing.pipelines.router_model` prefers a warm target close to the best one)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from router.routing.resolve import Resolution, answering_model
from router.status.model_status import ModelStatus, ModelStatusReader
from switchboard.config import PipelineLookup


class WarmTargets:
    """Which of a router's targets are warm, read while the router decides: a target is warm when a
    live worker holds the model it would be answered by for this caller (for a cascade, its draft;
    for another router, its default). Until the read is in, nothing counts as warm."""

    # How old a model's shared status may be (`ModelStatusReader.read_shared`).
    MAX_AGE_S = 1.0

    def __init__(
        self, status: ModelStatusReader, targets: Mapping[str, Resolution], pipelines: PipelineLookup
    ) -> None:
        self._model_of = {target: answering_model(r.served, pipelines) for target, r in targets.items()}
        self._warm: set[str] = set()
        self._read = asyncio.create_task(self._read_states(status))

    async def _read_states(self, status: ModelStatusReader) -> None:
        models = sorted(set(self._model_of.values()))
        states = await asyncio.gather(
            *(status.read_shared(model, self.MAX_AGE_S) for model in models), return_exceptions=True
        )
        self._warm = {
            model
            for model, state in zip(models, states, strict=True)
            if isinstance(state, ModelStatus) and state.state == "warm"
        }

    def is_warm(self, target: str) -> bool:
        """Whether `target` (a router target's model, route or pipeline) would answer warm."""
        return self._model_of.get(target) in self._warm

    def close(self) -> None:
        self._read.cancel()
