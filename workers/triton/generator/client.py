"""The consumer's client for its local Triton model: every job on one gRPC stream, chunks out as bytes.

Opening a gRPC stream per job (as Triton's own asyncio client does) cost about 0.8 ms of every
job's first chunk on a small CPU machine, and CPU at every job in the worker and in Triton. One
long-lived bidirectional stream per model carries every job's request instead. The first request on
it opens the model's output stream (`workers.triton.generator.output_stream`): every job's chunks come back
on that one request's responses, many jobs' per response, tagged with their job's request, and a
job's last chunk says so. A job's own request lasts as long as the job and only an error comes
back on it (Triton marks its end with an empty final response, `triton_enable_empty_final_response`).
The client knows the model's one input and one output, so it also skips the readiness and
configuration questions that Triton's client asks before every request.

The worker's consumer lives in the process that hosts the model (Triton's model hands each request to
the engine's loop on a thread of the worker), so its client opens the model's output stream in process instead
(`local`): each job is still a Triton request from its start to its end, but its chunks come back
as objects handed from the model's thread to the client's loop, not as Triton responses.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Future
from typing import Protocol

from tritonclient.grpc import service_pb2

from workers.triton.generator.backend import CHUNK_OUTPUT, JOB_INPUT, STREAM_PARAMETER, TAG_PARAMETER
from workers.triton.generator.output_stream import CLOSE_OUTPUT, OPEN_OUTPUT, Posted, posted_batch_decoder
from workers.triton.request_stream import Outbox, TritonStreamError, carry_stream, end_stream

# Triton's BYTES tensors hold each element as a 4-byte little-endian length, then the bytes.
_LENGTH = struct.Struct("<I")

# The end of a job's responses, as the stream's reader hands it to the job.
_END = None
# The request ids of the output stream's request and of the one that ends it (jobs' requests are
# numbered).
_OUTPUT_ID = "output"
_CLOSE_OUTPUT_ID = "close"
# How long a job whose request has ended may still wait for its last chunk (it is on its way on the
# output stream, which Triton need not deliver after the request's end).
LAST_CHUNK_GRACE_S = 5.0
# The numbers of the gRPC streams that this process's clients open, upwards: a model's newest output
# stream ends its older ones (`workers.triton.generator.output_stream`), so a client that replaces another in
# this process takes the model's output over rather than share it with the closed one's listener.
_stream_numbers = itertools.count()


class LocalOutput(Protocol):
    """A Triton model in this process that hands its output stream's batches over directly."""

    def open_local_output(
        self, stream: int, deliver: Callable[[list[Posted] | None], None]
    ) -> Future[None]: ...


class TritonJobClient:
    """Streams jobs (many at once) through one decoupled Triton model, all on one gRPC stream."""

    def __init__(self, grpc_address: str, model_name: str, *, local: LocalOutput | None = None) -> None:
        self.model_name = model_name
        self._local = local
        self._address = grpc_address
        self._tags = itertools.count()
        self._stream = -1  # the number of the gRPC stream open now
        # Each waiting job's inbox, by its request's tag: its chunks, then _END or the error that ended it.
        self._inboxes: dict[int, asyncio.Queue[bytes | BaseException | None]] = {}
        self._outbox: Outbox = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None
        # Why the open stream ended, when its end was seen beside gRPC (its local output ended).
        self._ended: TritonStreamError | None = None
        self._closed = False

    async def stream(self, job_payload: bytes) -> AsyncGenerator[bytes, None]:
        """Send an encoded job; yield each encoded chunk the model returns, in order."""
        if self._closed:
            raise TritonStreamError(f"the client of {self.model_name} is closed")
        tag = next(self._tags)
        inbox: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
        self._inboxes[tag] = inbox
        try:
            self._open()
            self._outbox.put_nowait(
                _infer_request(self.model_name, str(tag), job_payload, stream=self._stream, tag=tag)
            )
            while (item := await inbox.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            # Whatever still comes for a job left early is dropped by the reader.
            self._inboxes.pop(tag, None)

    async def close(self) -> None:
        """End the stream and close the channel; jobs still waiting end with an error at once."""
        self._closed = True
        closed = TritonStreamError(f"the client of {self.model_name} was closed")
        for inbox in self._inboxes.values():
            inbox.put_nowait(closed)
        self._inboxes.clear()
        if self._reader is not None:
            if self._local is None:
                # The output stream's request would never end by itself: it is ended, answered, and
                # the stream then ends without a cancel (which Triton may wait on forever).
                self._outbox.put_nowait(
                    _infer_request(self.model_name, _CLOSE_OUTPUT_ID, CLOSE_OUTPUT, stream=self._stream)
                )
            await end_stream(self._reader, self._outbox)

    def _open(self) -> None:
        """Start the stream and its reader, unless they run; a stream that ended is opened anew."""
        if self._reader is None:
            self._outbox = asyncio.Queue()
            self._stream = next(_stream_numbers)
            self._ended = None
            if self._local is None:
                self._outbox.put_nowait(
                    _infer_request(self.model_name, _OUTPUT_ID, OPEN_OUTPUT, stream=self._stream)
                )
            else:
                self._open_local(self._local, self._stream)
            self._reader = asyncio.create_task(
                self._read(self._outbox), name=f"triton-stream-{self.model_name}"
            )

    def _open_local(self, local: LocalOutput, stream: int) -> None:
        loop = asyncio.get_running_loop()

        def deliver(batch: list[Posted] | None) -> None:
            # On the model's thread; the batch is handled on this client's loop (once that has
            # closed, nobody waits for these chunks).
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._on_local_output, stream, batch)

        local.open_local_output(stream, deliver)

    def _on_local_output(self, stream: int, batch: list[Posted] | None) -> None:
        if batch is not None:
            self._hand_over(batch)
        elif stream == self._stream and self._reader is not None:
            # The model is being unbound: its jobs on this stream end, as with Triton's output request.
            self._ended = TritonStreamError(f"the output stream of {self.model_name} ended")
            self._reader.cancel()

    async def _read(self, outbox: Outbox) -> None:
        ended: BaseException = TritonStreamError(f"the stream of {self.model_name} was closed")
        try:
            ended = await carry_stream(self._address, outbox, self.model_name, self._on_response)
        finally:
            # Every job sent on this stream, or waiting to be, ends; the next job opens a new one.
            self._reader = None
            ended = self._ended or ended
            for inbox in self._inboxes.values():
                inbox.put_nowait(ended)

    def _on_response(self, response: service_pb2.ModelStreamInferResponse) -> None:
        if response.infer_response.id == _OUTPUT_ID:
            self._deliver(response)
        else:
            self._note_job_response(response)

    def _deliver(self, response: service_pb2.ModelStreamInferResponse) -> None:
        """Hand each chunk of an output stream's response to its job; the job's last ends it."""
        if response.error_message:
            raise TritonStreamError(
                f"the output stream of {self.model_name} failed: {response.error_message}"
            )
        result = response.infer_response
        if not result.raw_output_contents:  # its final response: the model is being unbound
            if self._closed:
                return  # ended by the client's own close: the stream ends once all is answered
            raise TritonStreamError(f"the output stream of {self.model_name} ended")
        self._hand_over(posted_batch_decoder.decode(_only_element(result.raw_output_contents[0])))

    def _hand_over(self, batch: list[Posted]) -> None:
        for posted in batch:
            inbox = self._inboxes.get(posted.tag)
            if inbox is None:
                continue  # its job has stopped reading
            inbox.put_nowait(posted.chunk)
            if posted.last:
                inbox.put_nowait(_END)
                self._inboxes.pop(posted.tag, None)

    def _note_job_response(self, response: service_pb2.ModelStreamInferResponse) -> None:
        """A job's own request answers only an error, or its end; the chunks come on the output stream."""
        request_id = response.infer_response.id
        inbox = self._inboxes.get(int(request_id)) if request_id.isdigit() else None
        if inbox is None:
            return  # its job has ended, or stopped reading
        if response.error_message:
            # Triton's error responses carry no final flag: the error ends the job.
            inbox.put_nowait(TritonStreamError(response.error_message))
            self._inboxes.pop(int(request_id), None)
            return
        final = response.infer_response.parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            # Its last chunk may still be on its way; a job whose last chunk never comes fails.
            asyncio.get_running_loop().call_later(
                LAST_CHUNK_GRACE_S, self._end_unfinished, int(request_id), inbox
            )

    def _end_unfinished(self, tag: int, inbox: asyncio.Queue[bytes | BaseException | None]) -> None:
        if self._inboxes.get(tag) is inbox:
            self._inboxes.pop(tag, None)
            inbox.put_nowait(
                TritonStreamError(f"a job's request on {self.model_name} ended without its last chunk")
            )


def _infer_request(
    model_name: str, request_id: str, payload: bytes, *, stream: int, tag: int | None = None
) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model_name, id=request_id)
    request.parameters[STREAM_PARAMETER].int64_param = stream
    if tag is not None:
        request.parameters[TAG_PARAMETER].int64_param = tag
    job_input = request.inputs.add()
    job_input.name = JOB_INPUT
    job_input.datatype = "BYTES"
    job_input.shape.append(1)
    request.outputs.add().name = CHUNK_OUTPUT
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    request.raw_input_contents.append(_LENGTH.pack(len(payload)) + payload)
    return request


def _only_element(raw: bytes) -> bytes:
    """The one element of a BYTES tensor of shape [1]."""
    (length,) = _LENGTH.unpack_from(raw)
    return raw[_LENGTH.size : _LENGTH.size + length]
