"""Batches that wait while the model's process computes go to it as one call, each answered with its
own rows; a failed call fails the batches in it; closing sends what waits."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from workers.engines.base import InvalidEngineRequest, PooledRow, PoolingRow
from workers.engines.pooling_sender import Answers, BatchSender


class HeldProcess:
    """Stands in for a model's process (the one piece doubled): answers each row with its text, and
    holds its first call until released."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.computing = threading.Event()
        self.release = threading.Event()

    def pool(self, rows: list[PoolingRow]) -> Answers:
        self.calls.append([str(row.input) for row in rows])
        self.computing.set()
        self.release.wait(10)
        if any(row.input == "boom" for row in rows):
            raise RuntimeError("the process failed")
        answers: Answers = [
            InvalidEngineRequest("too long")
            if row.input == "long"
            else PooledRow(values=str(row.input).encode(), prompt_tokens=1)
            for row in rows
        ]
        return answers


def rows(*texts: str) -> list[PoolingRow]:
    return [PoolingRow(task="embed", input=text) for text in texts]


def values(future: Future[Answers]) -> list[bytes | str]:
    return [answer.values if isinstance(answer, PooledRow) else str(answer) for answer in future.result(10)]


def test_batches_that_wait_while_one_computes_go_together() -> None:
    process = HeldProcess()
    sender = BatchSender(process.pool, name="test-sender")
    first = sender.submit(rows("a"))
    assert process.computing.wait(10)
    waiting = [sender.submit(rows("b", "c")), sender.submit(rows("long")), sender.submit(rows("d"))]
    process.release.set()
    assert values(first) == [b"a"]
    assert [values(future) for future in waiting] == [[b"b", b"c"], ["too long"], [b"d"]]
    assert process.calls == [["a"], ["b", "c", "long", "d"]]
    sender.close()


def test_a_failed_call_fails_every_batch_in_it_and_the_sender_goes_on() -> None:
    process = HeldProcess()
    sender = BatchSender(process.pool, name="test-sender")
    first = sender.submit(rows("a"))
    assert process.computing.wait(10)
    doomed = [sender.submit(rows("boom")), sender.submit(rows("b"))]
    process.release.set()
    assert values(first) == [b"a"]
    for future in doomed:
        with pytest.raises(RuntimeError, match="the process failed"):
            future.result(10)
    assert values(sender.submit(rows("after"))) == [b"after"]
    sender.close()


def test_closing_sends_what_waits_first() -> None:
    process = HeldProcess()
    process.release.set()
    sender = BatchSender(process.pool, name="test-sender")
    futures = [sender.submit(rows(text)) for text in ("x", "y", "z")]
    sender.close()
    assert [values(future) for future in futures] == [[b"x"], [b"y"], [b"z"]]
