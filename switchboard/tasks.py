"""The long-running asyncio loops each component owns: one `poll()` helper and one `TaskSet`.

Every background loop of a component is a task in its `TaskSet`; stopping the component stops the
set, which cancels every task and waits until each has unwound. A loop that runs one step on a
timer is written with `poll()`, which logs a failed step and goes on (saq's upkeep loops).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Coroutine
from typing import Any, cast

logger = logging.getLogger(__name__)


# A cancelled task can miss its cancellation: on Python 3.11, `asyncio.wait_for` (which redis-py
# awaits around every command it sends) returns the result of an operation that finished just as
# it was cancelled, and the cancellation is lost. A worker's controller stopped that way went on
# passing until its stop step timed out, 80 s later. So a stop cancels again, this often, until
# the task has ended.
CANCEL_AGAIN_S = 0.5


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel a background loop and wait until it has unwound (None is a no-op); re-raise its error."""
    if task is not None:
        await cancel_until_done([task])
        _raise_first_error([task])


async def cancel_until_done(tasks: Collection[asyncio.Task[Any]]) -> None:
    """Cancel `tasks`, again every CANCEL_AGAIN_S while any still runs, until every one has ended.

    What the tasks raised is left in them. `asyncio.wait` does not raise the tasks' cancellation,
    so a cancellation of the caller (a stop step's timeout) still reaches the caller.
    """
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=CANCEL_AGAIN_S)


def _raise_first_error(tasks: Collection[asyncio.Task[Any]]) -> None:
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            raise cast(BaseException, task.exception())


async def poll(
    step: Callable[[], Awaitable[object]],
    every_s: float | Callable[[], float],
    what: str,
    *,
    first_wait: bool = True,
    errors: tuple[type[BaseException], ...] = (Exception,),
    log: logging.Logger = logger,
    on_error: Callable[[BaseException], None] | None = None,
) -> None:
    """Run `step` every `every_s` seconds until cancelled; a step that raises one of `errors` is
    logged (as "could not <what>"), or handed to `on_error` (a summarized log, for an outage that
    fails every step), and tried again at the next tick.

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
            if on_error is not None:
                on_error(exc)
            else:
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
        try:
            await cancel_until_done(tasks)
            _raise_first_error(tasks)
        finally:
            self._tasks.difference_update(tasks)


async def first_of(*events: asyncio.Event, timeout_s: float) -> None:
    """Return once any of `events` is set, or after `timeout_s`."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
