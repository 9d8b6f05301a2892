"""The Triton-hop benchmark's own pieces: its paced engine, a level measured in process, the table."""

from __future__ import annotations

import argparse
import time

import pytest
from triton_hop import DEFAULT_POLICY, Level, PacedEngine, direct, table

from switchboard.wire import SamplingParams
from workers.engines.base import EngineRequest


async def test_the_paced_engine_streams_the_tokens_asked_for_and_marks_the_last() -> None:
    engine = PacedEngine(token_s=0.0)
    request = EngineRequest(request_id="r", sampling=SamplingParams(max_tokens=4), prompt="x")
    deltas = [delta async for delta in engine.generate(request)]
    assert [d.text for d in deltas] == ["t0 ", "t1 ", "t2 ", "t3 "]
    assert [d.last for d in deltas] == [False, False, False, True]
    assert deltas[-1].completion_tokens == 4 and deltas[-1].finish_reason == "length"


@pytest.mark.parametrize("idle_ms", [0.0, 30.0])
async def test_levels_in_process_count_every_job_and_chunk(idle_ms: float) -> None:
    args = argparse.Namespace(
        streams=[4], tokens=8, token_s=0.001, jobs_per_stream=2, single_jobs=5, idle_ms=idle_ms
    )
    started = time.perf_counter()
    single, loaded = await direct(args, DEFAULT_POLICY)
    # Each one-stream job waits its pause first (`--idle-ms`); the loaded levels never do.
    assert time.perf_counter() - started >= 5 * idle_ms / 1000
    assert (single.streams, single.jobs, single.chunks) == (1, 5, 5)
    assert (loaded.streams, loaded.jobs) == (4, 8)
    assert 8 <= loaded.chunks <= 64, "coalesced: at least a chunk per job, at most one per token"
    assert loaded.end_ms_p50 >= loaded.first_ms_p50 > 0


def test_the_table_puts_each_sides_ratio_under_each_level() -> None:
    hop = Level("Triton", 8, 10, 100, 4.0, 40.0, 6.0, 600.0)
    as_responses = Level("Triton, chunks as responses", 8, 10, 100, 6.0, 40.0, 8.0, 800.0)
    base = Level("direct", 8, 10, 100, 2.0, 20.0, 2.0, 200.0)
    lines = table([[hop], [as_responses]], [base])
    assert [line[1] for line in lines[1:4]] == ["Triton", "Triton, chunks as responses", "direct"]
    assert lines[-2][:6] == ["8", "Triton / direct", "2.00x", "2.00x", "3.00x", "3.00x"]
    assert lines[-1][:6] == ["8", "Triton, chunks as responses / direct", "3.00x", "2.00x", "4.00x", "4.00x"]
