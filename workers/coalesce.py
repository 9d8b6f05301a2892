"""Group engine deltas that arrive close together into one chunk.

Every hop after the engine (Triton, gRPC, Redis, SSE) costs per message, not per token. The rule:
a delta that arrives after a quiet spell goes out at once (no added wait for slow streams); while
deltas come faster than one per `window_s`, at most one chunk leaves per window, carrying all of
them, one chunk per choice. The first delta and the request's last delta never wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from workers.engines.base import Delta


def merge(deltas: list[Delta]) -> list[Delta]:
    """One delta per choice, carrying the text of all of that choice's deltas.

    Choices come in the order of their last delta, so the request's last delta stays last; each
    merged delta has the counts, finish reason and `last` flag of its choice's last delta.
    """
    if len(deltas) == 1:
        return deltas
    by_choice: dict[int, list[Delta]] = {}
    last_position: dict[int, int] = {}
    for position, delta in enumerate(deltas):
        by_choice.setdefault(delta.index, []).append(delta)
        last_position[delta.index] = position
    return [_join(by_choice[index]) for index in sorted(by_choice, key=last_position.__getitem__)]


def _join(group: list[Delta]) -> Delta:
    if len(group) == 1:
        return group[0]
    last = group[-1]
    return Delta(
        text="".join(d.text for d in group),
        logprobs=tuple(lp for d in group for lp in d.logprobs),
        tool_calls=tuple(call for d in group for call in d.tool_calls),
        index=last.index,
        prompt_tokens=last.prompt_tokens,
        completion_tokens=last.completion_tokens,
        finish_reason=last.finish_reason,
        last=last.last,
    )


async def coalesce(
    queue: asyncio.Queue[Delta | BaseException], window_s: Callable[[], float]
) -> AsyncIterator[list[Delta]]:
    """Yield merged deltas (one per choice) from `queue` until the request's last; re-raise errors.

    `window_s` is asked again for every chunk, so the window can follow the load.
    """
    loop = asyncio.get_running_loop()
    last_sent = float("-inf")
    while True:
        pending = [_unwrap(await queue.get())]
        _drain(queue, pending)
        send_at = last_sent + window_s()
        while not pending[-1].last and loop.time() < send_at:
            try:
                async with asyncio.timeout_at(send_at):
                    pending.append(_unwrap(await queue.get()))
            except TimeoutError:
                break
            _drain(queue, pending)
        merged = merge(pending)
        last_sent = loop.time()
        yield merged
        if merged[-1].last:
            return


def _drain(queue: asyncio.Queue[Delta | BaseException], pending: list[Delta]) -> None:
    while not queue.empty() and not pending[-1].last:
        pending.append(_unwrap(queue.get_nowait()))


def _unwrap(item: Delta | BaseException) -> Delta:
    if isinstance(item, BaseException):
        raise item
    return item
