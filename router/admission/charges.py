"""What a request is charged against its key's tokens per minute and token quotas, once it ends.

A queued job is charged the tokens its engine reports (`UsedTokens`): prompt and completion.

A pooling job (embeddings, classify, rerank) is charged its input tokens alone, reserved from an
estimate (`limits.pooling_input_tokens`: a reranker's query once beside each document) and settled
with what the engine read. That is OpenAI's rule, not a gap: an embedding is billed and rate-limited
on its input, and its usage says so (`prompt_tokens` = `total_tokens`, no completion tokens), as do
vLLM's classify and score answers and Cohere's and Jina's rerank. The key is charged exactly the
`total_tokens` its answer reports. An answer's size (its vectors' bytes, through Redis and to the
client) costs the deployment too, but it is no token count, and OpenAI does not count it: the
request's number of inputs and the model's dimensions bound it, not tpm.

A resumed stream (`Last-Event-ID`) delivers again part of an answer whose job was charged when it
was queued. It is charged for what it delivers (`DeliveredShare`), so that resuming one answer over
and over costs what asking for it again would, and one honest reconnection costs only the part it
receives:

- at admission it reserves the answer's estimate (`limits.estimate_completion_tokens` of the job as
  it was queued, kept in its record: the request re-sent cannot lower it; its prompt is not
  processed again), and is refused like any request while the bucket lacks it;
- read to the job's end, it is settled with its share of the job's completion tokens, in proportion
  to the characters it relayed (chunks carry text, not token counts; the job's last chunk tells how
  many tokens the whole answer held);
- ending any other way (its client left, the job failed, its deadline passed) it keeps what it
  reserved, as a queued job without usage does: leaving before the end must not be the cheap way
  to read an answer.

The reserved estimate can exceed what the bucket holds (a long answer under a small limit): it is
admitted once with a full bucket, as a queued job is, and the bucket pays it back over the minute.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol

from switchboard.wire import Chunk


class Charge(Protocol):
    """Follows the chunks a request hands out; `tokens` is what it is charged, None: its reservation."""

    @property
    def tokens(self) -> int | None: ...

    def chunk(self, chunk: Chunk) -> None:
        """Called for every chunk the request hands out, in order."""


class UsedTokens:
    """A queued job: the prompt and completion tokens of its last chunk's usage."""

    def __init__(self) -> None:
        self.tokens: int | None = None

    def chunk(self, chunk: Chunk) -> None:
        if chunk.usage is not None:
            self.tokens = chunk.usage.prompt_tokens + chunk.usage.completion_tokens


class DeliveredShare:
    """A resumed stream: its share of the job's completion tokens, by the characters it relayed
    after the `earlier` chunks its client had."""

    def __init__(self, earlier: Iterable[Chunk]) -> None:
        self._earlier = sum(size(chunk) for chunk in earlier)
        self._delivered = 0
        self.tokens: int | None = None

    def chunk(self, chunk: Chunk) -> None:
        self._delivered += size(chunk)
        if chunk.usage is not None:
            share = self._delivered / (self._earlier + self._delivered)
            self.tokens = math.ceil(chunk.usage.completion_tokens * share)


def size(chunk: Chunk) -> int:
    """How much of an answer a chunk holds: its characters, and at least 1 (it holds a token or more)."""
    calls = sum(len(call.name) + len(call.arguments) for call in chunk.tool_calls)
    return max(1, len(chunk.text) + calls)
