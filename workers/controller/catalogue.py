"""The slow-changing facts of the models a controller weighs, kept from one pass to the next.

Measured costs on this kind of worker, a model's last load failure and an operator's request change
rarely, and whoever changes one bumps the catalogue version (`switchboard.catalogue`). A controller
keeps what it read and drops it all when the version moved, or REFRESH_S after it read it: a fact
that expires (a failure at its retry time, an operator's request after DESIRED_TTL_S) bumps
nothing. A model's facts are read the first time a pass weighs it after that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from redis.asyncio.client import Pipeline

from switchboard import keys
from switchboard.wire import DesiredState, LoadFailure, desired_state_decoder, load_failure_decoder

# The longest a fact that expired (without bumping the version) is still believed here.
REFRESH_S = 30.0
# The measurements kept per model and worker kind that a decision uses ("files": the bytes of a
# remote model's files, which a load on a node without them fetches first).
_COSTS = ("load", "wake", "memory", "files")
# Replies of one model's reads: its failure, its desired state, its prefetch request, then each of _COSTS.
_READS = 3 + len(_COSTS)


@dataclass(frozen=True)
class ModelFacts:
    """What changes rarely about one model, as read at one catalogue version."""

    failure: LoadFailure | None
    desired: DesiredState | None
    load: list[bytes]  # measured samples (newest first) on this kind of worker
    wake: list[bytes]
    memory: list[bytes]
    files: list[bytes] = field(default_factory=list)
    prefetch: DesiredState | None = None

    def desired_now(self, now: float) -> DesiredState | None:
        """The operator's request, unless its key has expired since it was read."""
        if self.desired is None or self.desired.at + keys.DESIRED_TTL_S <= now:
            return None
        return self.desired

    def load_asked(self, now: float) -> bool:
        """Whether an operator's load request for the model lives (it keeps the model noted)."""
        desired = self.desired_now(now)
        return desired is not None and desired.action == "load"

    def prefetch_asked(self, now: float) -> bool:
        """Whether an operator's request to fetch the model's files on every node lives."""
        return self.prefetch is not None and self.prefetch.at + keys.PREFETCH_TTL_S > now

    def asked(self, now: float) -> bool:
        """Whether an operator's load or prefetch request keeps the model noted in the demand index."""
        return self.load_asked(now) or self.prefetch_asked(now)


class Catalogue:
    """This worker's copy of the facts of the models it weighs, valid for one catalogue version."""

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._facts: dict[str, ModelFacts] = {}
        self._version: bytes | None = None
        self._read_at = float("-inf")

    def at_version(self, version: bytes | None, now: float) -> None:
        """Forget every fact unless it was read at `version` less than REFRESH_S before `now`."""
        if version != self._version or now - self._read_at >= REFRESH_S:
            self._facts.clear()
            self._version = version
            self._read_at = now

    def get(self, model: str) -> ModelFacts | None:
        """The facts kept for `model`, if they were read at the current version."""
        return self._facts.get(model)

    def missing(self, models: Sequence[str]) -> list[str]:
        """Those of `models` whose facts are not kept."""
        return [model for model in models if model not in self._facts]

    def add_reads_to(self, pipe: Pipeline, models: Sequence[str]) -> None:
        """Queue the reads of the facts of `models` on `pipe` (`keep` takes their replies)."""
        for model in models:
            pipe.get(keys.load_failure(model))
            pipe.get(keys.desired_state(model))
            pipe.get(keys.prefetch_request(model))
            for operation in _COSTS:
                pipe.lrange(keys.measured_costs(model, self._kind, operation), 0, -1)

    def keep(self, models: Sequence[str], replies: Sequence[Any]) -> None:
        """Keep the facts of `models` from the replies of `add_reads_to`'s reads."""
        for index, model in enumerate(models):
            failure, desired, prefetch, load, wake, memory, files = replies[
                index * _READS : (index + 1) * _READS
            ]
            self._facts[model] = ModelFacts(
                failure=_decoded(load_failure_decoder, failure),
                desired=_decoded(desired_state_decoder, desired),
                load=load,
                wake=wake,
                memory=memory,
                files=files,
                prefetch=_decoded(desired_state_decoder, prefetch),
            )

    @staticmethod
    def reads(models: Sequence[str]) -> int:
        """How many replies `add_reads_to` queues for `models`."""
        return len(models) * _READS


def _decoded(decoder: msgspec.msgpack.Decoder[Any], payload: bytes | None) -> Any:
    return decoder.decode(payload) if payload else None
