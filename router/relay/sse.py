"""What the chat and completion relays share: SSE framing, job errors as OpenAI errors, usage, and
the per-choice assembly of a non-streamed answer.

A relay turns one job's result chunks into an OpenAI response: server-sent events for a streamed
request, one response object otherwise. One result chunk becomes at most one event: the engine side
already groups tokens that arrived together, and every event costs the client a parse.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import msgspec

from router.openai.common import CompletionUsage
from router.openai.errors import (
    EngineError,
    InvalidRequestError,
    JobTimeoutError,
    ModelLoadFailedError,
    ModelNotFoundError,
    OpenAIError,
)
from switchboard.wire import Chunk, JobError, TokenLogprob, ToolCall

SSE_DONE = b"data: [DONE]\n\n"
# The events that end a response's stream (`router.relay.responses`), which has no `[DONE]`.
_RESPONSE_ENDS = (
    b"event: response.completed\n",
    b"event: response.incomplete\n",
    b"event: response.failed\n",
)
_json = msgspec.json.Encoder()


class Relay(Protocol):
    """One job's chunks as an OpenAI response, streamed or assembled."""

    # The model the answer names: the one that writes its chunks.
    model: str
    # What ends a stream after its last event (`data: [DONE]`; nothing for a response's events).
    stream_end: bytes

    def events(self, chunks: AsyncIterator[Chunk]) -> AsyncIterator[bytes]:
        """Server-sent events for a streamed response, ending with ``data: [DONE]``."""
        ...

    def chunk_events(self, chunk: Chunk) -> list[bytes]:
        """The events of one chunk (none, one, or its choice's and the usage); a failed job's chunk
        gives its error event. `events` is these for every chunk, then ``data: [DONE]``."""
        ...

    def error_event(self, error: OpenAIError) -> bytes:
        """The closing event of a stream that fails after its headers were sent."""
        ...


async def events_of(relay: Relay, chunks: AsyncIterator[Chunk]) -> AsyncIterator[bytes]:
    """`relay`'s events for every chunk, up to a failed job's error event, then the stream's end."""
    async for chunk in chunks:
        for event in relay.chunk_events(chunk):
            yield event
        if chunk.error is not None:
            break
    if relay.stream_end:
        yield relay.stream_end


def ends_stream(body: bytes) -> bool:
    """Whether a write of a streamed answer holds its end: `[DONE]`, or a response's last event."""
    if body.endswith(SSE_DONE):
        return True
    # One scan from the end: a write holding a response's last event ends with it.
    last_event = body.rfind(b"event: response.")
    return last_event >= 0 and body.startswith(_RESPONSE_ENDS, last_event)


def sse_event(payload: msgspec.Struct) -> bytes:
    """Frame one JSON payload as a server-sent event."""
    return b"data: " + _json.encode(payload) + b"\n\n"


def sse_error(error: OpenAIError) -> bytes:
    """A stream's closing error event and its end."""
    return sse_event(error.body()) + SSE_DONE


def sse_comment(text: str) -> bytes:
    """An SSE comment line: SSE clients (EventSource, the `openai` SDK) skip it, proxies see traffic.
    Only for clients that asked for SSE in full: read-by-read parsers lose events behind a comment
    (`router.relay.first_byte`)."""
    return b": " + " ".join(text.splitlines()).encode() + b"\n\n"


def error_for(job_error: JobError, model: str) -> OpenAIError:
    """The client-facing error for a job of `model` that failed on the worker."""
    if job_error.code == "invalid_request" and job_error.client_code == "model_not_found":
        return ModelNotFoundError(model, [])  # an adapter removed while its job waited
    if job_error.code == "invalid_request":
        return InvalidRequestError(job_error.message, param=job_error.param, code=job_error.client_code)
    if job_error.code == "timeout":
        return JobTimeoutError(job_error.message)
    if job_error.code == "load_failed":
        # Workers send this to every waiting job when a load fails; the message is the reason.
        retry_after_s = job_error.retry_after_s if job_error.retry_after_s is not None else 0.0
        return ModelLoadFailedError(model, job_error.message, retry_after_s)
    return EngineError(job_error.message)


def openai_usage(chunk: Chunk) -> CompletionUsage:
    """OpenAI's usage object for the job's last chunk (zeros if it carried none)."""
    if chunk.usage is None:
        return CompletionUsage(prompt_tokens=0, completion_tokens=0, total_tokens=0)
    prompt, completion = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
    return CompletionUsage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )


class ChoiceText:
    """One choice of a non-streamed answer, gathered from its chunks."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.logprobs: list[TokenLogprob] = []
        self.tool_calls: list[ToolCall] = []
        self.finish_reason: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)


async def gather_choices(
    chunks: AsyncIterator[Chunk], model: str, n: int
) -> tuple[list[ChoiceText], CompletionUsage]:
    """Every choice's text, log probabilities and finish reason, and the usage; the job's error raised."""
    choices = [ChoiceText() for _ in range(n)]
    usage = CompletionUsage(prompt_tokens=0, completion_tokens=0, total_tokens=0)
    async for chunk in chunks:
        if chunk.error is not None:
            raise error_for(chunk.error, model)
        if chunk.index >= len(choices):
            choices.extend(ChoiceText() for _ in range(chunk.index + 1 - len(choices)))
        choice = choices[chunk.index]
        choice.parts.append(chunk.text)
        choice.logprobs.extend(chunk.logprobs)
        choice.tool_calls.extend(chunk.tool_calls)
        if chunk.finish_reason is not None:
            choice.finish_reason = chunk.finish_reason
        if chunk.is_last:
            usage = openai_usage(chunk)
    return choices, usage
