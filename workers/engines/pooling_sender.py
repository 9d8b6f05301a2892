"""Batches on their way to a pooling model's process: from a thread of their own, those waiting together.

The process computes one call at a time: batches handed over while one computes wait here (several
Triton instances, or a caller besides Triton), and when it is free they go as one call (their rows
together, each batch's answers back to it) instead of one small call after another.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

from workers.engines.base import InvalidEngineRequest, PooledRow, PoolingRow

Answers = list[PooledRow | InvalidEngineRequest]
_Batch = tuple[list[PoolingRow], "Future[Answers]"]


class BatchSender:
    """Sends batches to `pool` (a blocking call into the model's process) from one thread, the batches
    that waited meanwhile as one call."""

    def __init__(self, pool: Callable[[list[PoolingRow]], Answers], *, name: str) -> None:
        self._pool = pool
        self._waiting: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, rows: list[PoolingRow]) -> Future[Answers]:
        """Each row's answer, or its refusal, once computed; from any thread."""
        answers: Future[Answers] = Future()
        self._waiting.put((rows, answers))
        return answers

    def close(self) -> None:
        """Send what is waiting, then end the thread (blocking)."""
        self._waiting.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            first = self._waiting.get()
            if first is None:
                return
            batches, closing = [first], False
            while not closing:
                try:
                    more = self._waiting.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    closing = True
                else:
                    batches.append(more)
            self._send(batches)
            if closing:
                return

    def _send(self, batches: list[_Batch]) -> None:
        live = [(rows, answers) for rows, answers in batches if answers.set_running_or_notify_cancel()]
        try:
            answered = self._pool([row for rows, _ in live for row in rows])
        except Exception as exc:
            for _, answers in live:
                answers.set_exception(exc)
            return
        start = 0
        for rows, answers in live:
            answers.set_result(answered[start : start + len(rows)])
            start += len(rows)
