"""Waiting in a test for something another task or process makes true, with a bound."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

POLL_S = 0.02


async def eventually(probe: Callable[[], Awaitable[bool]], timeout_s: float = 10.0, what: str = "") -> None:
    """Until `probe()` holds; an AssertionError naming `what` (else the probe) after `timeout_s`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await probe():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what or getattr(probe, '__name__', probe)}")
        await asyncio.sleep(POLL_S)
