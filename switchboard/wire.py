"""The structs that cross Redis between the front door and the workers, and their codecs.

OpenAI's shapes stay at the edge (`router/openai/`); what travels through Redis is this smaller,
product-owned schema. Both sides import it; nothing else crosses between them.
"""

from __future__ import annotations

from typing import Literal

import msgspec

# Failures travel as Chunk.error, never as a finish reason.
FinishReason = Literal["stop", "length", "abort"]


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One message of a conversation, already flattened to text by the front door."""

    role: str
    content: str


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """How to sample; None means the engine's default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()


class Job(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One generation request waiting on its model's job stream.

    Exactly one of `messages` (chat) and `prompt` (plain completion) is set.
    """

    id: str
    model: str
    sampling: SamplingParams
    messages: tuple[ChatMessage, ...] | None = None
    prompt: str | None = None
    created: float
    # Unix time after which nobody waits for the result: a worker drops the job unstarted.
    deadline: float
    tenant: str | None = None
    # W3C trace context (traceparent, tracestate) of the front door's span.
    trace: dict[str, str] | None = None


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Token counts reported by the engine for a finished job."""

    prompt_tokens: int
    completion_tokens: int


class JobError(msgspec.Struct, frozen=True, kw_only=True):
    """Why a job failed; `code` maps to an HTTP status at the front door."""

    code: Literal["invalid_request", "timeout", "engine_error", "cancelled", "load_failed"]
    message: str
    # For failures that pass (a model that failed to load is retried later): when to try again.
    retry_after_s: float | None = None


class Chunk(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A piece of one job's output, as appended to its result stream.

    Tokens that arrived together travel together in `text`. The last chunk of a job carries its
    `finish_reason` and `usage`, or an `error`.
    """

    text: str = ""
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: JobError | None = None

    @property
    def is_last(self) -> bool:
        """Whether nothing follows this chunk on the job's result stream."""
        return self.finish_reason is not None or self.error is not None


SlotState = Literal["cold", "loading", "warm", "sleeping", "unloading"]


class SlotStatus(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One model on one worker, as its heartbeat advertises it (times are unix seconds)."""

    model: str
    state: SlotState
    # The replica number whose lease this worker holds for the model, while it holds one.
    replica: int | None = None
    in_flight: int = 0
    # When the current load (or wake) began, and how long it is expected to take (measured).
    load_started: float | None = None
    expected_load_s: float | None = None
    # When it last became warm, and when its last job ended (or it became warm, if later).
    warm_since: float | None = None
    idle_since: float | None = None
    # When keep-alive will move it down the ladder (warm → sleeping → cold); None: not while busy,
    # or never.
    leaves_at: float | None = None
    memory_bytes: int = 0
    # Jobs finished per second while it had work: what the queue drains at on this worker.
    jobs_per_s: float = 0.0


class WorkerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """How a worker advertises itself in Redis (refreshed by its heartbeat)."""

    id: str
    host: str
    pid: int
    started: float
    heartbeat: float
    # Models warm on this worker (what it takes jobs for).
    models: tuple[str, ...]
    triton_http_port: int
    triton_grpc_port: int
    triton_metrics_port: int
    # The machine kind load times are measured per ("cpu", or the GPU's name).
    kind: str = "cpu"
    # Models this worker may hold; empty: every configured model.
    allowed: tuple[str, ...] = ()
    max_loaded_models: int = 1
    memory_budget_bytes: int = 0
    memory_used_bytes: int = 0
    # Every model that is not cold here.
    slots: tuple[SlotStatus, ...] = ()


class LoadFailure(msgspec.Struct, frozen=True, kw_only=True):
    """A model whose last load failed: requests get this reason until `retry_at` (unix seconds)."""

    model: str
    worker_id: str
    reason: str
    failed_at: float
    retry_at: float
    failures_in_a_row: int = 1


class DesiredState(msgspec.Struct, frozen=True, kw_only=True):
    """An operator's request to load or unload a model (`POST /admin/models/{name}/load|unload`)."""

    action: Literal["load", "unload"]
    # Unix time of the request: an unload applies to replicas whose load began before it.
    at: float


# One encoder and one decoder per type, built once per process (msgspec's fast path).
_encoder = msgspec.msgpack.Encoder()
job_decoder = msgspec.msgpack.Decoder(Job)
chunk_decoder = msgspec.msgpack.Decoder(Chunk)
worker_decoder = msgspec.msgpack.Decoder(WorkerRecord)
load_failure_decoder = msgspec.msgpack.Decoder(LoadFailure)
desired_state_decoder = msgspec.msgpack.Decoder(DesiredState)


def encode(value: Job | Chunk | WorkerRecord | LoadFailure | DesiredState) -> bytes:
    """Serialize a wire struct to msgpack."""
    return _encoder.encode(value)
