"""The Triton model of a generator on Triton's Python backend, where the worker's own backend
(`workers.triton.native_backend`, the same model in C inside tritonserver) is not built: a decoupled
Python-backend model that hands each request to the worker's engine loop over a Unix socket and sends
back what the loop answers.

Triton runs this file as the model's `model.py` in its Python backend stub (`workers.triton.host`
writes it into Triton's model repository with the model's `config.pbtxt`). Every job is still a
Triton request from its start to its end: `execute` sends the request's job to the worker's engine
loop (`workers.triton.generator.job_socket`) and returns; a thread of the stub reads the loop's answers and
sends them on the request's response sender: its responses (for a client that reads a job's chunks
as responses, or a model's output stream), and its end. The worker's own client takes its jobs'
chunks in process (`GeneratorModel.open_local_output`), so for it a job's request carries the job in
and its end back, nothing else.

Before, PyTriton carried each request from the stub to the worker: its proxy in the stub, its
communication thread and its inference thread in the worker, each a hand-over (about 2.5 ms of a
job's time to its first token at one stream, traced). Here the request crosses one socket and is read
on the loop that drives the engine.

This file runs inside the stub with only the standard library, numpy and Triton's own module; the
framing below is the worker's side's too (`workers.triton.generator.job_socket` imports it).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import struct
import threading
import time
from typing import Any

JOB_INPUT = "job"
CHUNK_OUTPUT = "chunk"
# Where the worker's engine loop takes this model's requests (a Unix socket).
SOCKET_PARAMETER = "socket"
# The request parameters the worker's client sets, passed on as they are: TAG_PARAMETER tags a job's
# request (its chunks on the output stream carry the same tag), STREAM_PARAMETER names the client's
# gRPC stream it came on (numbered upwards; see `workers.triton.generator.output_stream`).
STREAM_PARAMETER = "switchboard_stream"
TAG_PARAMETER = "switchboard_tag"
# How long the stub waits, at its start, for the engine loop to listen (it listens before the load).
CONNECT_WAIT_S = 10.0

# Every message, either way: its length after the header, its kind, the request's key (the stub's
# number for it), and for a job the client's stream and tag (NO_TAG: a request without one).
HEADER = struct.Struct("<IBQqq")
NO_TAG = -1
# Stub to engine loop: a request (its payload the job, or the output stream's opening).
JOB = 1
# Engine loop to stub: one response (its payload the output tensor's one element), the request's
# end, or its end with an error (its payload the message).
RESPONSE, END, FAILED = 2, 3, 4


def message(kind: int, key: int, payload: bytes = b"", *, stream: int = 0, tag: int = NO_TAG) -> bytes:
    """One message as it goes on the socket."""
    return HEADER.pack(len(payload), kind, key, stream, tag) + payload


def read_exactly(connection: socket.socket, size: int) -> bytes:
    """`size` bytes from `connection`; EOFError once it has closed."""
    data = bytearray()
    while len(data) < size:
        part = connection.recv(size - len(data))
        if not part:
            raise EOFError("the engine loop closed its socket")
        data += part
    return bytes(data)


class TritonPythonModel:
    """Triton's Python-backend model: requests out to the engine loop, its answers back to Triton."""

    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        self._name = config["name"]
        self._senders: dict[int, Any] = {}
        self._keys = itertools.count()
        self._lock = threading.Lock()
        self._connection = _connect(config["parameters"][SOCKET_PARAMETER]["string_value"])
        self._reader = threading.Thread(target=self._read_answers, name="answers", daemon=True)
        self._reader.start()

    def execute(self, requests: list[Any]) -> None:
        import triton_python_backend_utils as pb_utils

        for request in requests:
            payload = bytes(pb_utils.get_input_tensor_by_name(request, JOB_INPUT).as_numpy().reshape(-1)[0])
            stream, tag = _stream_and_tag(request)
            key = next(self._keys)
            with self._lock:
                self._senders[key] = request.get_response_sender()
            try:
                self._connection.sendall(message(JOB, key, payload, stream=stream, tag=tag))
            except OSError as exc:
                self._end(key, f"{self._name} cannot take jobs: its engine loop is gone ({exc})")
        return None

    def finalize(self) -> None:
        with contextlib.suppress(OSError):
            self._connection.shutdown(socket.SHUT_RDWR)
        self._reader.join(timeout=5.0)
        self._connection.close()

    def _read_answers(self) -> None:
        """Send each answer of the engine loop on its request; once the loop has gone, end the rest."""
        import numpy as np
        import triton_python_backend_utils as pb_utils

        try:
            while True:
                length, kind, key, _, _ = HEADER.unpack(read_exactly(self._connection, HEADER.size))
                payload = read_exactly(self._connection, length) if length else b""
                if kind == RESPONSE:
                    with self._lock:
                        sender = self._senders.get(key)
                    if sender is not None:
                        output = pb_utils.Tensor(CHUNK_OUTPUT, np.array([payload], dtype=np.object_))
                        self._send(key, sender, pb_utils.InferenceResponse(output_tensors=[output]))
                elif kind == END:
                    self._end(key)
                elif kind == FAILED:
                    self._end(key, payload.decode(errors="replace"))
        except (EOFError, OSError):
            pass
        with self._lock:
            left = list(self._senders)
        for key in left:
            self._end(key, f"{self._name}'s engine loop ended while the job ran")

    def _end(self, key: int, error: str | None = None) -> None:
        import triton_python_backend_utils as pb_utils

        with self._lock:
            sender = self._senders.pop(key, None)
        if sender is None:
            return
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        # A request whose client has gone (Triton closed its sender) refuses every send: that is its
        # end too. Nothing a send raises may stop this thread, or every other request it serves would
        # never end, and Triton would wait for them forever before it unloads the model.
        with contextlib.suppress(Exception):
            if error is None:
                sender.send(flags=final)
            else:
                response = pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(error))
                sender.send(response, flags=final)

    def _send(self, key: int, sender: Any, response: Any) -> None:
        """One response of a request; a request that refuses it (its client has gone) is ended."""
        try:
            sender.send(response)
        except Exception as exc:
            self._end(key, f"{self._name} could not answer the request: {exc}")


def _connect(path: str) -> socket.socket:
    deadline = time.monotonic() + CONNECT_WAIT_S
    while True:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(path)
            return connection
        except OSError:
            connection.close()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker's engine loop does not listen at {path}") from None
            time.sleep(0.05)


def _stream_and_tag(request: Any) -> tuple[int, int]:
    try:
        parameters = json.loads(request.parameters() or "{}")
    except ValueError:
        parameters = {}
    stream, tag = parameters.get(STREAM_PARAMETER, 0), parameters.get(TAG_PARAMETER, NO_TAG)
    return (stream if isinstance(stream, int) else 0, tag if isinstance(tag, int) else NO_TAG)
