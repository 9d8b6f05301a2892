"""The fixture of one worker's real pieces around a scripted engine, for the modules that ask for it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from tests.support.one_worker import Worker, running_worker


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def worker() -> AsyncIterator[Worker]:
    """One worker (Redis, Triton, consumer, writer, a warm scripted model), shared by a test module."""
    async with running_worker() as started:
        yield started
