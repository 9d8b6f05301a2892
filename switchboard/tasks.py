"""The long-running asyncio loops each component owns: one `poll()` helper and one `TaskSet`.

Every background loop of a component is a task in its `TaskSet`; stopping the component stops the
set, which cancels every task and waits until each has unwound. A loop that runs one step on a
timer is written with `poll()`, which logs a failed step and goes on (saq's upkeep loops).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

logger = logging.getLogger(__name__)


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel a background loop and wait until it has unwound (None is a no-op)."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def poll(
    step: Callable[[], Awaitable[object]],
    every_s: float | Callable[[], float],
    what: str,
    *,
    first_wait: bool = True,
    errors: tuple[type[BaseException], ...] = (Exception,),
    log: logging.Logger = logger,
) -> None:
    """Run `step` every `every_s` seconds until cancelled; a step that raises one of `errors` is
    logged (as "could not <what>") and tried again at the next tick.

    `every_s` may be a function, read before each wait (a loop whose pace depends on its state).
    With `first_wait=False` the first step runs at once.
    """
    wait = first_wait
    while True:
        if wait:
            await asyncio.sleep(every_s() if callable(every_s) else every_s)
        wait = True
        try:
            await step()
        except errors as exc:
            log.warning(f"could not {what}", extra={"error": str(exc) or type(exc).__name__})


class TaskSet:
    """The background tasks of one component; `stop()` cancels and awaits every one of them."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run `coroutine` as a task of this set, named `<owner>: <name>` (so a stuck stop names it)."""
        task = asyncio.create_task(coroutine, name=f"{self._owner}: {name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    async def stop(self) -> None:
        """Cancel every task of the set and wait until each has unwound; idempotent."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
