"""Shared by every test folder: a private redis-server per test session, and each folder's time limit."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.local.redis_server import PrivateRedis
from tests.support.span_file import span_file  # noqa: F401 (a fixture, for every test)

# Seconds one test may take (setup and teardown included), by its folder under tests/; each well
# above the slowest test there on a loaded 2-core machine. Unit folders run in seconds; the front
# door's and the worker's start real Redis, Triton and their servers in-process; end-to-end and
# deployment tests start real engines (60-120 s each when the machine is busy) and whole stacks.
FOLDER_TIMEOUT_S = {"router": 300.0, "workers": 300.0, "e2e": 900.0, "deploy": 900.0}
UNIT_TIMEOUT_S = 120.0
# A test marked e2e starts a real engine wherever it lives.
E2E_TIMEOUT_S = 900.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give each test its folder's time limit, unless it (or its module) sets its own."""
    tests_root = config.rootpath / "tests"
    for item in items:
        if item.get_closest_marker("timeout") is not None:
            continue
        item.add_marker(pytest.mark.timeout(_timeout_s(item, tests_root)))


def _timeout_s(item: pytest.Item, tests_root: Path) -> float:
    if item.get_closest_marker("e2e") is not None:
        return E2E_TIMEOUT_S
    try:
        folder = item.path.relative_to(tests_root).parts[0]
    except ValueError:  # a test outside tests/
        return UNIT_TIMEOUT_S
    return FOLDER_TIMEOUT_S.get(folder, UNIT_TIMEOUT_S)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[PrivateRedis]:
    """A real redis-server on a free port, for the whole session."""
    with PrivateRedis() as server:
        yield server


@pytest.fixture(autouse=True)
def restore_key_prefix() -> Iterator[None]:
    """A process sets its key prefix once (the CLI does); each test leaves it as it found it."""
    previous = keys.PREFIX
    yield
    keys.set_prefix(previous)


@pytest.fixture
async def redis(redis_server: PrivateRedis) -> AsyncIterator[aioredis.Redis]:
    """A client of the session's Redis, emptied before and after each test."""
    client = aioredis.Redis.from_url(redis_server.url)
    await client.flushdb()
    yield client
    await client.flushdb()
    await client.aclose()
