"""A pooling job is admitted on its inputs' tokens alone: it generates none."""

from __future__ import annotations

from router.admission.limits import estimate_tokens
from router.intake.job import pooling_job
from switchboard.wire import PoolingTask


def test_a_pooling_job_counts_its_inputs_and_no_completion() -> None:
    embed = pooling_job("e", PoolingTask(task="embed", inputs=("x" * 40, (1, 2, 3))), timeout_s=5)
    assert estimate_tokens(embed, completion_tokens=256) == 10 + 3


def test_a_reranker_reads_the_query_beside_every_document() -> None:
    score = pooling_job(
        "r", PoolingTask(task="score", inputs=("d" * 8, "d" * 4), query="q" * 20), timeout_s=5
    )
    assert estimate_tokens(score, completion_tokens=256) == (2 + 5) + (1 + 5)
