"""Events an attacker can repeat are logged once, then as one count per window."""

from __future__ import annotations

import asyncio
import logging

import pytest

from router.telemetry.summarized_log import SummarizedLog


async def test_a_burst_is_one_line_then_one_count(caplog: pytest.LogCaptureFixture) -> None:
    log = SummarizedLog(logging.getLogger("test.summary"), every_s=0.2)
    with caplog.at_level(logging.WARNING, logger="test.summary"):
        for _ in range(1000):
            log.event("header_timeout", "closed a slow connection", client="1.2.3.4:5")
        log.event("over_capacity", "refused a connection")
        assert [r.getMessage() for r in caplog.records] == [
            "closed a slow connection",
            "refused a connection",
        ]
        await asyncio.sleep(0.3)
    messages = [r.getMessage() for r in caplog.records]
    assert (
        messages[2] == "closed a slow connection (999 more like it in the last 0 s)"
        or "999 more" in messages[2]
    )
    assert len(messages) == 3
    assert caplog.records[2].count == 999  # type: ignore[attr-defined]
