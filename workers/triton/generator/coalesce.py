"""Group engine deltas that arrive close together into one chunk.

Every hop after the engine (Triton, gRPC, Redis, SSE) costs per message, not per token. The rule:
a delta that arrives after a quiet spell goes out at once (no added wait for slow streams); while
deltas come faster than one per `window_s`, at most one chunk leaves per window, carrying all of
them, one chunk per choice. The first delta and the request's last delta never wait, nor does the
first text after chunks that carried none (a first token that decodes to no text, a special token of
a vision model's answer, say): a client's first text is never held for a window.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from workers.engines.base import Delta
from workers.triton.generator.wakeup import Wakeup


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


class DeltaInbox:
    """The deltas of one request on their way from the engine to the coalescer.

    An asyncio.Queue would wake the coalescer for every token of every stream; this wakes it only
    when it has something to do: for the first delta after a quiet spell, for the request's last
    delta or an error (neither waits), and when its window ends. The engine's side costs an append.
    """

    def __init__(self) -> None:
        self._items: list[Delta | BaseException] = []
        self._wakeup = Wakeup()

    def put_nowait(self, item: Delta | BaseException) -> None:
        """Hand over a delta (or the error that ends the request)."""
        self._items.append(item)
        self._wakeup.wake(urgent=_urgent(item))

    async def take(self) -> list[Delta]:
        """Everything that has arrived, once something has; raises an error that arrived."""
        if not self._items:
            await self._wakeup.wait(urgent_only=False, deadline=None)
        return self._take_all()

    async def take_by(self, deadline: float) -> list[Delta]:
        """Everything that has arrived by `deadline` (loop time), or as soon as the last delta or
        an error arrives; raises an error that arrived."""
        await self._wakeup.wait(urgent_only=True, deadline=deadline)
        return self._take_all()

    def qsize(self) -> int:
        """How many items wait to be taken."""
        return len(self._items)

    def _take_all(self) -> list[Delta]:
        """Every delta that has arrived, up to the request's last (nothing after it is taken)."""
        taken: list[Delta] = []
        for position, item in enumerate(self._items):
            if isinstance(item, BaseException):
                del self._items[: position + 1]
                raise item
            taken.append(item)
            if item.last:
                break
        del self._items[: len(taken)]
        return taken


def _shows_output(delta: Delta) -> bool:
    """Whether a chunk of `delta` gives the client something to show (a window starts after it)."""
    return bool(delta.text or delta.tool_calls or delta.logprobs)


def _urgent(item: Delta | BaseException) -> bool:
    return isinstance(item, BaseException) or item.last


async def coalesce(inbox: DeltaInbox, window_s: Callable[[], float]) -> AsyncIterator[list[Delta]]:
    """Yield merged deltas (one per choice) from `inbox` until the request's last; re-raise errors.

    `window_s` is asked again for every chunk, so the window can follow the load.
    """
    loop = asyncio.get_running_loop()
    last_sent = float("-inf")
    while True:
        pending = await inbox.take()
        send_at = last_sent + window_s()
        if not pending[-1].last and loop.time() < send_at:
            pending += await inbox.take_by(send_at)
        merged = merge(pending)
        if any(_shows_output(delta) for delta in merged):
            last_sent = loop.time()
        yield merged
        if merged[-1].last:
            return
