"""Unit tests of a pooling model's process answering one batch from Triton's stub (`_answered`): the
reply carries every row's answer or refusal in order, and a batch the runner fails becomes one error
the stub hands to each of the batch's requests (the runner is a stand-in: the real one is tested in
test_torch_pooling, and the whole path in tests/workers/triton/test_pooling_model)."""

from __future__ import annotations

import threading

from workers.engines.base import InvalidEngineRequest, PooledRow, PoolingRow
from workers.engines.torch_pooling.process import _answered
from workers.triton.pooling.backend import FAILED, OK, frame, unframe
from workers.triton.pooling.model import answer_decoder, row_encoder


class EchoRunner:
    """Answers each row with its own text's length; refuses the row "too long"."""

    def pool_now(self, rows: list[PoolingRow]) -> list[PooledRow | InvalidEngineRequest]:
        return [
            InvalidEngineRequest("too long", param="input")
            if row.input == "too long"
            else PooledRow(values=b"\x00" * 4, prompt_tokens=len(str(row.input)))
            for row in rows
        ]


class BrokenRunner:
    def pool_now(self, rows: list[PoolingRow]) -> list[PooledRow | InvalidEngineRequest]:
        raise RuntimeError("out of memory")


def batch(*texts: str) -> bytes:
    return frame(row_encoder.encode(PoolingRow(task="embed", input=text)) for text in texts)


def test_every_row_is_answered_in_order_and_a_refusal_answers_its_own_row() -> None:
    reply = _answered(batch("one", "too long", "three!"), EchoRunner(), threading.Lock())  # type: ignore[arg-type]
    assert reply[:1] == OK
    answers = [answer_decoder.decode(item) for item in unframe(reply, 1)]
    assert [answer.prompt_tokens for answer in answers] == [3, 0, 6]
    assert (answers[1].error, answers[1].param) == ("too long", "input")
    assert answers[0].error is None and answers[2].error is None


def test_a_batch_the_runner_fails_is_one_error_that_says_why() -> None:
    reply = _answered(batch("one", "two"), BrokenRunner(), threading.Lock())  # type: ignore[arg-type]
    assert reply[:1] == FAILED
    assert reply[1:].decode() == "RuntimeError: out of memory"


def test_a_message_that_is_not_rows_fails_the_batch_not_the_process() -> None:
    reply = _answered(frame([b"not msgpack of a row"]), EchoRunner(), threading.Lock())  # type: ignore[arg-type]
    assert reply[:1] == FAILED
