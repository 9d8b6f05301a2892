"""Group engine deltas that arrive close together into one chunk.

Every hop after the engine (Triton, gRPC, Redis, SSE) costs per message, not per token. The rule:
a delta that arrives after a quiet spell goes out at once (no added wait for slow streams); while
deltas come faster than one per `window_s`, at most one chunk leaves per window, carrying all of
them. The first delta and the last (finish) delta never wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from workers.engines.base import Delta


def merge(deltas: list[Delta]) -> Delta:
    """One delta carrying the text of all, and the counts and finish reason of the last."""
    if len(deltas) == 1:
        return deltas[0]
    last = deltas[-1]
    return Delta(
        text="".join(d.text for d in deltas),
        prompt_tokens=last.prompt_tokens,
        completion_tokens=last.completion_tokens,
        finish_reason=last.finish_reason,
    )


async def coalesce(
    queue: asyncio.Queue[Delta | BaseException], window_s: Callable[[], float]
) -> AsyncIterator[Delta]:
    """Yield merged deltas from `queue` until one has a finish reason; re-raise queued errors.

    `window_s` is asked again for every chunk, so the window can follow the load.
    """
    loop = asyncio.get_running_loop()
    last_sent = float("-inf")
    while True:
        pending = [_unwrap(await queue.get())]
        _drain(queue, pending)
        send_at = last_sent + window_s()
        while pending[-1].finish_reason is None and loop.time() < send_at:
            try:
                async with asyncio.timeout_at(send_at):
                    pending.append(_unwrap(await queue.get()))
            except TimeoutError:
                break
            _drain(queue, pending)
        merged = merge(pending)
        last_sent = loop.time()
        yield merged
        if merged.finish_reason is not None:
            return


def _drain(queue: asyncio.Queue[Delta | BaseException], pending: list[Delta]) -> None:
    while not queue.empty() and pending[-1].finish_reason is None:
        pending.append(_unwrap(queue.get_nowait()))


def _unwrap(item: Delta | BaseException) -> Delta:
    if isinstance(item, BaseException):
        raise item
    return item
