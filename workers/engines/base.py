"""The one interface every engine implements: start, generate, abort, stop, sleep, and what it occupies.

Engines know nothing of Redis or jobs: they take an EngineRequest and stream Deltas. A pooling engine
(an embedder, a classifier, a reranker) is an Engine too, so that it is loaded, placed, kept alive and
evicted like any other, but it answers `pool`: rows in, one row out per row, no stream. Which class
implements which engine name is the registry's business (`workers.engines.registry`).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Literal, NoReturn

import msgspec

from switchboard.config import ModelConfig
from switchboard.wire import (
    ChatMessage,
    FinishReason,
    ImageInput,
    ModelLimits,
    Prompt,
    SamplingParams,
    TokenLogprob,
    ToolCall,
)

PoolingTaskName = Literal["embed", "classify", "score"]


class Adapter(msgspec.Struct, frozen=True, kw_only=True):
    """A LoRA adapter loaded into its base's engine: the model it serves, the engine's number for it
    (unique among the adapters of one engine, never 0), and the folder it was loaded from."""

    name: str
    id: int
    path: str


class AdapterRefused(ValueError):
    """The adapter cannot be loaded into this engine (its files, its rank); the message says why."""


class EngineRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One generation: a conversation (chat template applied by the engine) or a plain prompt.

    `sampling.n` choices are generated, numbered from 0.
    """

    request_id: str
    sampling: SamplingParams
    messages: tuple[ChatMessage, ...] | None = None
    # With `messages`: OpenAI's `tools` list as JSON text, for the chat template, and whether the
    # model's tool calls are to be parsed from its text.
    tools: str | None = None
    parse_tool_calls: bool = False
    # With `messages`: the images their `parts` name by index (the job's, as the front door checked them).
    images: tuple[ImageInput, ...] = ()
    prompt: Prompt | None = None
    # Text already generated for this request by a worker that died (one choice only): generation
    # goes on after it, and its tokens count as completion tokens (and against max_tokens).
    continuation: str | None = None
    # How many new tokens of a choice the engine may hold before it hands them over (the first
    # and the last never wait): a consumer that coalesces them anyway is woken less often. An
    # engine without such a setting hands every token over.
    output_every: int = 1
    # Mixed into the prefix cache's block hashes (the job's, one per API key): only requests with
    # the same salt share cached prefixes. None: the shared cache.
    cache_salt: str | None = None
    # The LoRA adapter that answers, loaded into the engine beforehand (None: the base model).
    adapter: Adapter | None = None


class Delta(msgspec.Struct, kw_only=True):
    """New output of one choice of a request; the counts are the request's totals so far.

    `finish_reason` ends the choice; `last` ends the request (every choice has finished).
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    index: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: FinishReason | None = None
    last: bool = False


class Footprint(msgspec.Struct, frozen=True, kw_only=True):
    """What a started engine occupies, for placement and eviction decisions."""

    device: str
    memory_bytes: int


class InvalidEngineRequest(ValueError):
    """The request cannot run on this model (prompt too long, bad stop, ...): the client's fault.

    `param` names the request parameter at fault; `code` is OpenAI's code for the mistake.
    """

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


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

    def limits(self) -> ModelLimits | None:
        """What the started model accepts; None where the engine cannot tell."""
        return None

    def max_sequences(self) -> int | None:
        """Requests the started engine runs in one batch (vLLM's `max_num_seqs`); None: no known
        limit. A worker takes no more of the model's jobs at once, so the rest wait in its stream."""
        return None

    def process_ids(self) -> list[int]:
        """The started engine's own processes (that compute), whose CPU priority the worker may set;
        empty where it computes in the worker's process or has not started."""
        return []

    def ended(self) -> str | None:
        """Why the started engine can no longer generate (its process was killed, ran out of memory,
        crashed), if so; None while it can, and after a `stop`. Its model is then unloaded, and
        loaded again when someone asks for it. An engine that restarts its own process says None."""
        return None

    async def load_adapter(self, adapter: Adapter) -> None:
        """Load a LoRA adapter, so that requests naming it run on it; raises AdapterRefused."""
        raise AdapterRefused(f"{self.model.name} does not serve LoRA adapters on {type(self).__name__}")

    async def unload_adapter(self, adapter: Adapter) -> None:
        """Drop a loaded adapter (no request of it runs any more)."""
        raise AdapterRefused(f"{self.model.name} does not serve LoRA adapters on {type(self).__name__}")

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


class PoolingRow(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One input of a pooling job, with its job's options: the engine pools rows of many jobs at once."""

    task: PoolingTaskName
    # Text, or token ids used as given; for "score", the document scored against `query`.
    input: Prompt
    query: str | None = None
    # "embed": keep the first so many dimensions, and renormalize.
    dimensions: int | None = None
    # Keep only the last so many tokens (-1: as many as the model takes); None: too long is refused.
    truncate_prompt_tokens: int | None = None
    normalize: bool = True


class PooledRow(msgspec.Struct, frozen=True, kw_only=True):
    """A row's answer and the tokens the model read for it (a pair's query included)."""

    # Little-endian float32 values, as the job's answer carries them: an embedding, a probability
    # per label, or one relevance score.
    values: bytes
    prompt_tokens: int


class PoolingEngine(Engine):
    """A model that answers once per row (embed, classify, score) instead of streaming text."""

    @property
    @abc.abstractmethod
    def batch_socket(self) -> Path:
        """Where the model's process takes the batches Triton's stub sends it (a Unix socket)."""

    @abc.abstractmethod
    async def pool(self, rows: Sequence[PoolingRow]) -> list[PooledRow | InvalidEngineRequest]:
        """Each row's answer, in order; a row the model cannot take gets its refusal, not the batch."""

    def labels(self) -> tuple[str, ...]:
        """A classifier's label names, in the order of its rows' values; () for the other kinds."""
        return ()

    def generate(self, request: EngineRequest) -> NoReturn:
        raise InvalidEngineRequest(f"{self.model.name} is a pooling model: it does not generate text")

    async def abort(self, request_id: str) -> None:
        """Nothing to abort: a row's answer takes one engine call, which runs to its end."""
