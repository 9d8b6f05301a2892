"""A completion of several prompts: one engine request per prompt, their deltas as one request's.

OpenAI numbers the choices of prompt `i` from `i * n`, and reports one usage for all of them; the
engine knows nothing of that. Here each prompt's request runs concurrently, its choices are
renumbered, and the counts are summed, so the coalescer and the relay see one request.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from workers.engines.base import Delta, Engine, EngineRequest


class DeltaSink(Protocol):
    """Where deltas go (the coalescer's inbox; a queue in tests)."""

    def put_nowait(self, item: Delta | BaseException, /) -> None: ...


async def fan_in(engine: Engine, requests: list[EngineRequest], n: int, inbox: DeltaSink) -> None:
    """Run `requests` at once, putting their deltas in `inbox` as those of one request.

    The last delta of the last request to end is the only one marked `last`. An error in any
    request cancels the others and propagates.
    """
    totals = [(0, 0)] * len(requests)
    unfinished = len(requests)

    async def run(position: int, request: EngineRequest) -> None:
        nonlocal unfinished
        async for delta in engine.generate(request):
            totals[position] = (delta.prompt_tokens, delta.completion_tokens)
            if delta.last:
                unfinished -= 1
            inbox.put_nowait(
                Delta(
                    text=delta.text,
                    index=position * n + delta.index,
                    logprobs=delta.logprobs,
                    tool_calls=delta.tool_calls,
                    prompt_tokens=sum(prompt for prompt, _ in totals),
                    completion_tokens=sum(completion for _, completion in totals),
                    finish_reason=delta.finish_reason,
                    last=delta.last and unfinished == 0,
                )
            )

    try:
        async with asyncio.TaskGroup() as group:
            for position, request in enumerate(requests):
                group.create_task(run(position, request))
    except ExceptionGroup as failed:
        # The first failure is the request's failure (a prompt too long is the client's fault).
        raise failed.exceptions[0] from None
