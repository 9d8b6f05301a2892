"""The consumer's client for a local pooling model: a job through the batched Triton model, one chunk out.

It has a generator client's face (`stream(payload)` yields encoded chunks), so the consumer runs a
pooling job like any other: its one chunk is the last, with the rows and the usage, or an error. A
job's inputs go as one request (a list input is one job, never one request per input), or as several
of at most `max_batch_size` rows each, sent together; Triton's dynamic batcher groups them with other
jobs' requests. The request carries the job's time left: a job whose deadline passes in Triton's
queue ends with a timeout.

Jobs that reach the client in the same turn of its event loop (the jobs of one read of the model's
stream) travel together: their rows go as one Triton request (or as few as `max_batch_size`
allows), and each job gets its own rows' answers back. Triton's batcher still groups the requests
of several reads, but the worker no longer pays a gRPC call, a stub hop and PyTriton's handling
per job: at 128 clients those were most of the worker's CPU per embedding.

Requests go on one long-lived gRPC stream per model (Triton's streaming API), each numbered, and
its one answer comes back under its number. A job's deadline is kept here:
one that passes while its request waits in Triton's queue ends the job with a timeout (its rows may
still be computed; their answer is dropped).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import struct
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field

from tritonclient.grpc import service_pb2

from switchboard.wire import Chunk, Job, JobError, PoolingTask, Usage, encode
from workers.engines.base import PoolingRow
from workers.runtime.pooling_metrics import PoolingMetrics
from workers.triton.engine_job import engine_job_decoder
from workers.triton.pooling.backend import (
    ANSWERS_OUTPUT,
    BATCH_COLUMNS,
    BATCH_OUTPUT,
    ROWS_INPUT,
    SENT_PARAMETER,
    frame,
    unframe,
)
from workers.triton.pooling.model import RowAnswer, answer_decoder, encoded_rows
from workers.triton.request_stream import Outbox, TritonStreamError, carry_stream, end_stream


def rows_of(task: PoolingTask) -> list[PoolingRow]:
    """A pooling job's rows, one per input, each with the job's options."""
    return [
        PoolingRow(
            task=task.task,
            input=item,
            query=task.query,
            dimensions=task.dimensions,
            truncate_prompt_tokens=task.truncate_prompt_tokens,
            normalize=task.normalize,
        )
        for item in task.inputs
    ]


@dataclass
class _Waiting:
    """Rows of one job waiting to be sent, and where their answers go."""

    rows: Sequence[PoolingRow]
    timeout_s: float
    answers: asyncio.Future[list[RowAnswer]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class PoolingJobClient:
    """Sends pooling jobs (many at once) to one batched Triton model over the worker's gRPC socket."""

    def __init__(
        self,
        grpc_address: str,
        model_name: str,
        *,
        max_batch_size: int,
        labels: tuple[str, ...] = (),
        together: bool = True,
        model: str | None = None,
        on_stub_lost: Callable[[], None] = lambda: None,
    ) -> None:
        """`together` False sends every job's rows as requests of their own (`batching.enabled` false:
        nothing is batched, for comparison). `model`: the configured model's name, which labels its
        metrics (the Triton model's name if not given). `on_stub_lost` is called when Triton answers
        that a stub of the model is unhealthy (it died): Triton does not start it again by itself."""
        self.model_name = model_name
        self._together = together
        self._max_rows = max_batch_size
        self._labels = labels
        self._metrics = PoolingMetrics(model or model_name)
        self._stream = _RequestStream(grpc_address, model_name, on_stub_lost)
        self._closed = False
        # Rows handed over in this turn of the loop, sent together at its end.
        self._waiting: list[_Waiting] = []
        self._sending: set[asyncio.Task[None]] = set()

    async def stream(self, job_payload: bytes) -> AsyncGenerator[bytes, None]:
        """Run an encoded pooling job; yield its one encoded chunk (the answer, or an error)."""
        if self._closed:
            raise TritonStreamError(f"the client of {self.model_name} is closed")
        job = engine_job_decoder.decode(job_payload)
        yield encode(await self._answer(job))

    async def close(self) -> None:
        """End the stream; jobs still waiting end with an error."""
        self._closed = True
        await self._stream.close()

    async def _answer(self, job: Job) -> Chunk:
        if job.pooling is None:
            message = (
                f"{job.model} is a pooling model: it answers embeddings, classifications or scores only."
            )
            return Chunk(error=JobError(code="invalid_request", message=message, param="model"))
        rows = rows_of(job.pooling)
        parts = [rows[start : start + self._max_rows] for start in range(0, len(rows), self._max_rows)]
        timeout_s = job.deadline - time.time()
        if timeout_s <= 0:
            return _expired()
        waiting = [_Waiting(part, timeout_s) for part in parts]
        if not self._together:
            for one in waiting:
                self._send([one])
        else:
            if not self._waiting:
                asyncio.get_running_loop().call_soon(self._send_waiting)
            self._waiting.extend(waiting)
        try:
            # Awaited in this task, not through wait_for and gather: each of those is one more turn
            # of the worker's busy loop between the batch's answer and the job's result write.
            async with asyncio.timeout(timeout_s):
                if len(waiting) == 1:
                    answered = [await waiting[0].answers]
                else:
                    answered = await asyncio.gather(*(w.answers for w in waiting))
        except TimeoutError:
            return _expired()
        answers = [answer for part in answered for answer in part]
        return self._chunk(answers)

    def _chunk(self, answers: Sequence[RowAnswer]) -> Chunk:
        for index, answer in enumerate(answers):
            if answer.error is not None:
                where = f"`input[{index}]`: " if len(answers) > 1 else ""
                error = JobError(
                    code="invalid_request",
                    message=where + answer.error,
                    param=answer.param or "input",
                    client_code=answer.code,
                )
                return Chunk(error=error)
        usage = Usage(prompt_tokens=sum(answer.prompt_tokens for answer in answers), completion_tokens=0)
        return Chunk(pooled=tuple(answer.values for answer in answers), labels=self._labels, usage=usage)

    def _send_waiting(self) -> None:
        """Send the rows handed over in this turn of the loop, as few requests as the batch allows."""
        waiting, self._waiting = self._waiting, []
        group: list[_Waiting] = []
        for one in waiting:
            if group and sum(len(w.rows) for w in group) + len(one.rows) > self._max_rows:
                self._send(group)
                group = []
            group.append(one)
        if group:
            self._send(group)

    def _send(self, group: list[_Waiting]) -> None:
        task = asyncio.ensure_future(self._infer_together(group))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _infer_together(self, group: list[_Waiting]) -> None:
        """One request for the group's rows; each job's future gets its own rows' answers."""
        rows = [row for one in group for row in one.rows]
        try:
            answers = await self._infer(rows, max(one.timeout_s for one in group))
        except Exception as exc:
            for one in group:
                if not one.answers.done():
                    one.answers.set_exception(exc)
            return
        start = 0
        for one in group:
            if not one.answers.done():  # its job may have given up waiting (its deadline)
                one.answers.set_result(answers[start : start + len(one.rows)])
            start += len(one.rows)

    async def _infer(self, rows: Sequence[PoolingRow], timeout_s: float) -> list[RowAnswer]:
        response = await self._stream.infer(_infer_request(self.model_name, rows), timeout_s)
        outputs = {output.name: index for index, output in enumerate(response.outputs)}
        raw = response.raw_output_contents
        answers = [answer_decoder.decode(element) for element in unframe(raw[outputs[ANSWERS_OUTPUT]])]
        if BATCH_OUTPUT in outputs:
            batch_rows, held_ns, first = struct.unpack_from(f"<{BATCH_COLUMNS}q", raw[outputs[BATCH_OUTPUT]])
            self._metrics.batch(rows=batch_rows, held_s=held_ns / 1e9, first_of_batch=bool(first))
        self._metrics.answered(rows=len(answers), tokens=sum(answer.prompt_tokens for answer in answers))
        if len(answers) != len(rows):
            raise TritonStreamError(f"{self.model_name} answered {len(answers)} rows of {len(rows)}")
        return answers


class _RequestStream:
    """One long-lived gRPC stream to the model: requests go out tagged with a number, each one's
    answer comes back under it (the model answers once per request)."""

    def __init__(
        self,
        grpc_address: str,
        model_name: str,
        on_stub_lost: Callable[[], None],
    ) -> None:
        self._address = grpc_address
        self._model_name = model_name
        self._on_stub_lost = on_stub_lost
        self._tags = itertools.count()
        self._waiting: dict[str, asyncio.Future[service_pb2.ModelInferResponse]] = {}
        self._outbox: Outbox = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None

    async def infer(
        self, request: service_pb2.ModelInferRequest, timeout_s: float
    ) -> service_pb2.ModelInferResponse:
        """Send `request`; its answer, or TritonStreamError, or TimeoutError after `timeout_s`."""
        request.id = str(next(self._tags))
        answer: asyncio.Future[service_pb2.ModelInferResponse] = asyncio.get_running_loop().create_future()
        self._waiting[request.id] = answer
        try:
            self._open()
            self._outbox.put_nowait(request)
            async with asyncio.timeout(timeout_s):
                return await answer
        finally:
            self._waiting.pop(request.id, None)

    async def close(self) -> None:
        if self._reader is not None:
            await end_stream(self._reader, self._outbox)

    def _open(self) -> None:
        if self._reader is None:
            self._outbox = asyncio.Queue()
            self._reader = asyncio.create_task(
                self._read(self._outbox), name=f"triton-pooling-{self._model_name}"
            )

    async def _read(self, outbox: Outbox) -> None:
        ended: BaseException = TritonStreamError(f"the stream of {self._model_name} was closed")
        try:
            ended = await carry_stream(self._address, outbox, self._model_name, self._deliver)
        finally:
            # Every request sent on this stream, or waiting to be, fails; the next opens a new one.
            self._reader = None
            for answer in self._waiting.values():
                if not answer.done():
                    answer.set_exception(ended)

    def _deliver(self, response: service_pb2.ModelStreamInferResponse) -> None:
        answer = self._waiting.pop(response.infer_response.id, None)
        if answer is None or answer.done():
            return  # it gave up waiting (its deadline), or this is an empty final response
        if response.error_message:
            if _STUB_UNHEALTHY.search(response.error_message):
                self._on_stub_lost()
            answer.set_exception(TritonStreamError(f"{self._model_name} failed: {response.error_message}"))
        else:
            answer.set_result(response.infer_response)


# How Triton answers a request for an instance whose Python stub has died (killed, out of memory).
_STUB_UNHEALTHY = re.compile(r"Stub process '[^']*' is not healthy")


def _expired() -> Chunk:
    return Chunk(
        error=JobError(code="timeout", message="the job's deadline passed while it waited for its model")
    )


def _infer_request(model_name: str, rows: Sequence[PoolingRow]) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model_name)
    request.parameters[SENT_PARAMETER].int64_param = time.time_ns()
    rows_input = request.inputs.add()
    rows_input.name = ROWS_INPUT
    rows_input.datatype = "BYTES"
    rows_input.shape.extend([len(rows), 1])
    request.outputs.add().name = ANSWERS_OUTPUT
    request.outputs.add().name = BATCH_OUTPUT
    request.raw_input_contents.append(frame(encoded_rows(rows)))  # a BYTES tensor's layout
    return request
