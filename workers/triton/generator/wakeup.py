"""One task's wait for more to do: woken by anything, or (while it waits for a deadline) only by what is urgent.

The coalescer's inbox and the model's output stream both hold items for one reader and must wake it
only when it has something to do: for the first item after a quiet spell, for an urgent one, and
when its deadline comes. Waking costs nothing while nobody waits.
"""

from __future__ import annotations

import asyncio


class Wakeup:
    """The waiting point of one reader."""

    def __init__(self) -> None:
        self._waiter: asyncio.Future[None] | None = None
        self._urgent_only = False

    def wake(self, *, urgent: bool) -> None:
        """Something arrived; `urgent` wakes a reader that waits for its deadline too."""
        waiter = self._waiter
        if waiter is not None and (urgent or not self._urgent_only):
            _wake(waiter)

    async def wait(self, *, urgent_only: bool, deadline: float | None) -> None:
        """Wait to be woken (only by what is urgent, with `urgent_only`), or until `deadline` (loop time)."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        self._urgent_only = urgent_only
        timer = loop.call_at(deadline, _wake, waiter) if deadline is not None else None
        try:
            await waiter
        finally:
            if self._waiter is waiter:
                self._waiter = None
            if timer is not None:
                timer.cancel()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
