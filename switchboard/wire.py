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

    code: Literal["invalid_request", "timeout", "engine_error", "cancelled"]
    message: str


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


class WorkerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """How a worker advertises itself in Redis (refreshed by its heartbeat)."""

    id: str
    host: str
    pid: int
    started: float
    heartbeat: float
    models: tuple[str, ...]
    triton_http_port: int
    triton_grpc_port: int
    triton_metrics_port: int


# One encoder and one decoder per type, built once per process (msgspec's fast path).
_encoder = msgspec.msgpack.Encoder()
job_decoder = msgspec.msgpack.Decoder(Job)
chunk_decoder = msgspec.msgpack.Decoder(Chunk)
worker_decoder = msgspec.msgpack.Decoder(WorkerRecord)


def encode(value: Job | Chunk | WorkerRecord) -> bytes:
    """Serialize a wire struct to msgpack."""
    return _encoder.encode(value)
