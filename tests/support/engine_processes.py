"""The processes an engine leaves below the test process, told apart from the ones that stay by design."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import psutil
import pytest

# Processes that outlive any one engine on purpose: multiprocessing's resource tracker, and the
# worker's fork server (started with the first forked vLLM engine, kept for the next ones; it names
# itself `switchboard::engine-fork-server`).
LASTING = ("resource_tracker", "forkserver", "engine-fork-server")


def descendants() -> set[int]:
    """Every process below this one now."""
    return {process.pid for process in psutil.Process().children(recursive=True)}


def engine_processes(before: set[int]) -> list[int]:
    """Processes below this one that were not there `before` and are not of the lasting kind."""
    found = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if process.pid in before or process.status() == psutil.STATUS_ZOMBIE:
                continue
            command = " ".join(process.cmdline())
            if not any(mark in command for mark in LASTING):
                found.append(process.pid)
    return found


async def poll_until(condition: Callable[[], bool], timeout_s: float, what: str = "the condition") -> None:
    """Wait until `condition()` holds; fail the test after `timeout_s`."""
    for _ in range(int(timeout_s / 0.1)):
        if condition():
            return
        await asyncio.sleep(0.1)
    pytest.fail(f"{what}: not so after {timeout_s:g} s")
