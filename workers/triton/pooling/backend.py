"""The Triton model of a pooling model on Triton's Python backend, where the worker's own backend
(`workers.triton.native_backend`, the same model in C inside tritonserver, with no stub and no shared
memory) is not built: a Python-backend model that hands each batch to the model's process over a
Unix socket. The framing below is the native backend's too (`native/pooling.c`).

Triton runs this file as the model's `model.py` in its Python backend stub (`workers.triton.host`
writes it into Triton's model repository with the model's `config.pbtxt`). Triton's dynamic batcher
groups the requests of a window; `execute` gets them as one batch, sends every row to the pooling
model's process in one message and gives each request exactly its own rows' answers, in order. The
batch goes straight from the stub to the process that computes it: no PyTriton proxy, no hop through
the worker's threads (at 1 to 128 clients that was 6-21 % of an embedder's requests per second, and
2-2.6 ms of a lone request's latency, in `bench/embeddings.py`).

Not decoupled, and two instances by default (`BatchingConfig.instances`), each a stub with its own
connection: an instance is busy while its batch computes, and the model's process computes one batch
at a time, so while one computes the batcher gathers the next and the other instance hands it over,
to wait for the process there (with one instance the process was idle for the hops of every batch:
about a quarter of each batch's cycle at 32 clients). The process is the worker's (started from its
fork server, restarted when it dies); each stub connects to it at its first batch and again after
the process was replaced.

This file runs inside the stub with only the standard library, numpy and Triton's own module; the
framing below is shared with the process's side (`workers.engines.torch_pooling.process`).
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterable
from multiprocessing.connection import Client, Connection
from typing import Any

ROWS_INPUT = "rows"
ANSWERS_OUTPUT = "answers"
# Per row of a request: rows in the batch it rode in, ns it was held before the batch ran, and 1 on
# the first row of the batch's first request (so that the worker counts each batch once).
BATCH_OUTPUT = "batch"
BATCH_COLUMNS = 3
# When the worker's client sent the request (time.time_ns()): the batch measures its hold from it.
SENT_PARAMETER = "sent_ns"
# The model's process: where its socket is.
SOCKET_PARAMETER = "socket"
# How long a batch waits for the model's process to listen (it is being started, or restarted).
CONNECT_WAIT_S = 10.0

# A message is its items, each a 4-byte little-endian length and the bytes (Triton's BYTES layout);
# an answer's first byte says whether the items are the answers (OK) or one error message (FAILED).
_LENGTH = struct.Struct("<I")
OK, FAILED = b"\x00", b"\x01"


def frame(items: Iterable[bytes]) -> bytes:
    """Items as one message."""
    return b"".join(_LENGTH.pack(len(item)) + item for item in items)


def unframe(data: bytes | memoryview, offset: int = 0) -> list[bytes]:
    """The items of a message, from `offset`."""
    items = []
    view = memoryview(data)
    while offset < len(view):
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += _LENGTH.size
        items.append(bytes(view[offset : offset + length]))
        offset += length
    return items


class TritonPythonModel:
    """Triton's Python-backend model: one batch of requests, one call to the model's process."""

    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        self._socket = config["parameters"][SOCKET_PARAMETER]["string_value"]
        self._name = config["name"]
        self._connection: Connection | None = None

    def execute(self, requests: list[Any]) -> list[Any]:
        import numpy as np
        import triton_python_backend_utils as pb_utils

        arrived_ns = time.time_ns()
        rows_of = [
            [
                bytes(element)
                for element in pb_utils.get_input_tensor_by_name(request, ROWS_INPUT).as_numpy().reshape(-1)
            ]
            for request in requests
        ]
        total = sum(len(own) for own in rows_of)
        try:
            answers = self._pool([row for own in rows_of for row in own])
        except Exception as exc:
            error = pb_utils.TritonError(f"{self._name} failed a batch: {exc}")
            return [pb_utils.InferenceResponse(output_tensors=[], error=error) for _ in requests]
        responses, start = [], 0
        for index, (request, own) in enumerate(zip(requests, rows_of, strict=True)):
            encoded = np.empty((len(own), 1), dtype=np.object_)
            for row, answer in enumerate(answers[start : start + len(own)]):
                encoded[row, 0] = answer
            start += len(own)
            batch = np.zeros((len(own), BATCH_COLUMNS), dtype=np.int64)
            batch[:, 0] = total
            batch[:, 1] = max(0, arrived_ns - _sent_ns(request))
            batch[0, 2] = 1 if index == 0 else 0
            outputs = [pb_utils.Tensor(ANSWERS_OUTPUT, encoded), pb_utils.Tensor(BATCH_OUTPUT, batch)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses

    def finalize(self) -> None:
        if self._connection is not None:
            self._connection.close()

    def _pool(self, rows: list[bytes]) -> list[bytes]:
        """The rows' encoded answers, from the model's process (connected to first if need be)."""
        connection = self._connected()
        try:
            connection.send_bytes(frame(rows))
            reply = connection.recv_bytes()
        except (EOFError, OSError) as exc:
            self._connection = None  # the process ended; the next batch reaches its replacement
            connection.close()
            raise RuntimeError("the model's process ended during the batch; it is being restarted") from exc
        if reply[:1] != OK:
            raise RuntimeError(bytes(reply[1:]).decode(errors="replace"))
        answers = unframe(reply, 1)
        if len(answers) != len(rows):
            raise RuntimeError(f"the model's process answered {len(answers)} rows of {len(rows)}")
        return answers

    def _connected(self) -> Connection:
        if self._connection is not None:
            return self._connection
        deadline = time.monotonic() + CONNECT_WAIT_S
        while True:
            try:
                self._connection = Client(self._socket, family="AF_UNIX")
                return self._connection
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the model's process does not listen at {self._socket}; the worker's log may say why"
                    ) from None
                time.sleep(0.05)


def _sent_ns(request: Any) -> int:
    try:
        sent = json.loads(request.parameters() or "{}").get(SENT_PARAMETER)
    except ValueError:
        return time.time_ns()
    return sent if isinstance(sent, int) else time.time_ns()
