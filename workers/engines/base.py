"""The one interface every engine implements: start, generate, abort, stop, sleep, and what it occupies.

Engines know nothing of Redis or jobs: they take an EngineRequest and stream Deltas. Which class
implements which engine name is the registry's business (`workers.engines.registry`).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator

import msgspec

from switchboard.config import ModelConfig
from switchboard.wire import ChatMessage, FinishReason, SamplingParams


class EngineRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One generation: a conversation (chat template applied by the engine) or a plain prompt."""

    request_id: str
    sampling: SamplingParams
    messages: tuple[ChatMessage, ...] | None = None
    prompt: str | None = None


class Delta(msgspec.Struct, kw_only=True):
    """New output of one request; the counts are totals so far, not increments."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason | None = None


class Footprint(msgspec.Struct, frozen=True, kw_only=True):
    """What a started engine occupies, for placement and eviction decisions."""

    device: str
    memory_bytes: int


class InvalidEngineRequest(ValueError):
    """The request cannot run on this model (prompt too long, bad stop, ...): the client's fault."""


class Engine(abc.ABC):
    """A model loaded into one inference engine."""

    def __init__(self, model: ModelConfig) -> None:
        self.model = model

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model; returns when it can generate."""

    @abc.abstractmethod
    def generate(self, request: EngineRequest) -> AsyncIterator[Delta]:
        """Stream the output of `request`; the last delta carries the finish reason."""

    @abc.abstractmethod
    async def abort(self, request_id: str) -> None:
        """Stop generating for `request_id`; its stream ends with finish reason "abort"."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Release everything the engine holds."""

    @abc.abstractmethod
    def footprint(self) -> Footprint:
        """What the engine occupies while started; before `start`, what it is expected to occupy."""

    @property
    def supports_sleep(self) -> bool:
        """Whether `sleep` frees memory and `wake` is much faster than a new start (GPU sleep modes)."""
        return False

    async def sleep(self) -> None:
        """Free most of what the engine holds while keeping it ready to wake; needs `supports_sleep`."""
        raise NotImplementedError(f"{type(self).__name__} has no sleep mode")

    async def wake(self) -> None:
        """Undo `sleep`: return when the engine can generate again."""
        raise NotImplementedError(f"{type(self).__name__} has no sleep mode")
