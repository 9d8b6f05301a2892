"""Result chunks → OpenAI chat completion: server-sent events, or one assembled response.

One result chunk becomes at most one event: the engine side already groups tokens that arrived
together, and every event costs the client a parse, so the relay never splits or pads them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec

from router.openai.chat import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatMessageOut,
)
from router.openai.common import Usage
from router.openai.errors import (
    EngineError,
    GatewayTimeoutError,
    InvalidRequestError,
    ModelLoadFailedError,
    OpenAIError,
)
from switchboard.wire import Chunk, JobError

SSE_DONE = b"data: [DONE]\n\n"
_json = msgspec.json.Encoder()


def sse_event(payload: msgspec.Struct) -> bytes:
    """Frame one JSON payload as a server-sent event."""
    return b"data: " + _json.encode(payload) + b"\n\n"


def sse_comment(text: str) -> bytes:
    """An SSE comment line: clients (the `openai` SDK among them) skip it, proxies see traffic."""
    return b": " + " ".join(text.splitlines()).encode() + b"\n\n"


def error_for(job_error: JobError, model: str) -> OpenAIError:
    """The client-facing error for a job of `model` that failed on the worker."""
    if job_error.code == "invalid_request":
        return InvalidRequestError(job_error.message)
    if job_error.code == "timeout":
        return GatewayTimeoutError(job_error.message)
    if job_error.code == "load_failed":
        # Workers send this to every waiting job when a load fails; the message is the reason.
        retry_after_s = job_error.retry_after_s if job_error.retry_after_s is not None else 0.0
        return ModelLoadFailedError(model, job_error.message, retry_after_s)
    return EngineError(job_error.message)


def _usage(chunk: Chunk) -> Usage | None:
    if chunk.usage is None:
        return None
    prompt, completion = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


class ChatRelay:
    """Relays one job's chunks as an OpenAI chat completion."""

    def __init__(self, *, job_id: str, model: str, created: int, include_usage: bool = False) -> None:
        self.completion_id = f"chatcmpl-{job_id}"
        self.model = model
        self.created = created
        self.include_usage = include_usage

    async def events(self, chunks: AsyncIterator[Chunk]) -> AsyncIterator[bytes]:
        """Server-sent events for a streamed response, ending with ``data: [DONE]``."""
        first = True
        async for chunk in chunks:
            if chunk.error is not None:
                yield sse_event(error_for(chunk.error, self.model).body())
                break
            if chunk.text or chunk.finish_reason is not None:
                yield sse_event(self._chunk_event(chunk, with_role=first))
                first = False
            if chunk.finish_reason is not None and self.include_usage:
                yield sse_event(self._usage_event(chunk))
        yield SSE_DONE

    def error_event(self, error: OpenAIError) -> bytes:
        """The closing event of a stream that fails after its headers were sent."""
        return sse_event(error.body()) + SSE_DONE

    async def assemble(self, chunks: AsyncIterator[Chunk]) -> ChatCompletion:
        """One response for `stream: false`; raises the job's error if it failed."""
        parts: list[str] = []
        last = Chunk()
        async for chunk in chunks:
            if chunk.error is not None:
                raise error_for(chunk.error, self.model)
            parts.append(chunk.text)
            last = chunk
        message = ChatMessageOut(content="".join(parts))
        choice = ChatChoice(index=0, message=message, finish_reason=last.finish_reason)
        usage = _usage(last) or Usage(prompt_tokens=0, completion_tokens=0, total_tokens=0)
        return ChatCompletion(
            id=self.completion_id, created=self.created, model=self.model, choices=[choice], usage=usage
        )

    def _chunk_event(self, chunk: Chunk, *, with_role: bool) -> ChatCompletionChunk:
        delta = ChatDelta(role="assistant" if with_role else None, content=chunk.text or None)
        if with_role and delta.content is None:
            delta.content = ""
        choice = ChatChunkChoice(index=0, delta=delta, finish_reason=chunk.finish_reason)
        event = ChatCompletionChunk(
            id=self.completion_id, created=self.created, model=self.model, choices=[choice]
        )
        if self.include_usage:
            event.usage = None
        return event

    def _usage_event(self, chunk: Chunk) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.completion_id, created=self.created, model=self.model, choices=[], usage=_usage(chunk)
        )
