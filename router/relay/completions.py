"""Result chunks → OpenAI (legacy) completion: server-sent events, or one assembled response.

The completions API lays log probabilities out in columns (tokens, their log probabilities, the top
alternatives and each token's character offset in the choice's text), so the relay keeps every
choice's offset as its text streams.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from router.openai.completions import Completion, CompletionChoice, CompletionLogprobs, CompletionRequest
from router.openai.errors import OpenAIError
from router.relay.sse import (
    SSE_DONE,
    error_for,
    events_of,
    gather_choices,
    openai_usage,
    sse_error,
    sse_event,
)
from switchboard.wire import Chunk, Job, TokenLogprob


class CompletionRelay:
    """Relays one job's chunks as an OpenAI completion."""

    stream_end = SSE_DONE

    def __init__(
        self, *, job_id: str, model: str, created: int, choices: int, include_usage: bool, logprobs: bool
    ) -> None:
        self.completion_id = f"cmpl-{job_id}"
        self.model = model
        self.created = created
        self.choices = choices
        self.include_usage = include_usage
        self.logprobs = logprobs
        # Characters streamed so far per choice: where its next token's text begins.
        self._offsets: dict[int, int] = {}

    def events(self, chunks: AsyncIterator[Chunk]) -> AsyncIterator[bytes]:
        """Server-sent events for a streamed response, ending with ``data: [DONE]``."""
        return events_of(self, chunks)

    def chunk_events(self, chunk: Chunk) -> list[bytes]:
        """The events of one chunk: its choice's, and the usage after the last; a failed job's error."""
        if chunk.error is not None:
            return [sse_event(error_for(chunk.error, self.model).body())]
        events = []
        if chunk.text or chunk.finish_reason is not None or chunk.logprobs:
            offset = self._offsets.get(chunk.index, 0)
            self._offsets[chunk.index] = offset + len(chunk.text)
            choice = CompletionChoice(
                index=chunk.index,
                text=chunk.text,
                finish_reason=chunk.finish_reason,
                logprobs=self._logprobs(chunk.logprobs, offset),
            )
            events.append(sse_event(self._event([choice])))
        if chunk.is_last and self.include_usage:
            usage = self._event([])
            usage.usage = openai_usage(chunk)
            events.append(sse_event(usage))
        return events

    def replay(self, earlier: list[Chunk]) -> None:
        """Take in the chunks whose events the client had before it resumed the stream
        (`Last-Event-ID`), so that the next log probabilities' text offsets go on from them."""
        for chunk in earlier:
            self._offsets[chunk.index] = self._offsets.get(chunk.index, 0) + len(chunk.text)

    def error_event(self, error: OpenAIError) -> bytes:
        """The closing event of a stream that fails after its headers were sent."""
        return sse_error(error)

    async def assemble(self, chunks: AsyncIterator[Chunk]) -> Completion:
        """One response for `stream: false`; raises the job's error if it failed."""
        gathered, usage = await gather_choices(chunks, self.model, self.choices)
        choices = [
            CompletionChoice(
                index=index,
                text=choice.text,
                finish_reason=choice.finish_reason,
                logprobs=self._logprobs(choice.logprobs, 0),
            )
            for index, choice in enumerate(gathered)
        ]
        return Completion(
            id=self.completion_id, created=self.created, model=self.model, choices=choices, usage=usage
        )

    def _event(self, choices: list[CompletionChoice]) -> Completion:
        event = Completion(id=self.completion_id, created=self.created, model=self.model, choices=choices)
        if self.include_usage:
            event.usage = None
        return event

    def _logprobs(self, logprobs: Sequence[TokenLogprob], offset: int) -> CompletionLogprobs | None:
        if not self.logprobs:
            return None
        return completion_logprobs(logprobs, offset)


def completion_logprobs(logprobs: Sequence[TokenLogprob], offset: int) -> CompletionLogprobs:
    """Log probabilities in the completions API's columns, the first token's text at `offset`."""
    columns = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    for entry in logprobs:
        columns.tokens.append(entry.token)
        columns.token_logprobs.append(entry.logprob)
        # A position without a log probability (an echoed prompt's first token) has no alternatives.
        top = None if entry.logprob is None else {alt.token: alt.logprob for alt in entry.top}
        columns.top_logprobs.append(top)
        columns.text_offset.append(offset)
        offset += len(entry.token)
    return columns


def completion_relay(request: CompletionRequest, job: Job, prompts: int) -> CompletionRelay:
    """The relay of `job`'s chunks as the answer to `request`, of `prompts` prompts."""
    return CompletionRelay(
        job_id=job.id,
        model=request.model,
        created=int(job.created),
        choices=prompts * request.n,
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
        logprobs=request.logprobs is not None,
    )
