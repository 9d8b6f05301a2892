"""The consumer's client for its local Triton models: one gRPC stream per job, chunks out as bytes.

PyTriton's own asyncio client asks Triton whether the server and model are ready, and for the
model's configuration, before every request: three extra round trips on each job's path. This
client knows the model's one input and one output and sends the request alone.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import numpy as np
import tritonclient.grpc.aio as triton_grpc

from workers.triton_model import CHUNK_OUTPUT, JOB_INPUT


class TritonJobClient:
    """Streams one job at a time (many concurrently) through a decoupled Triton model."""

    def __init__(self, grpc_address: str, model_name: str) -> None:
        self.model_name = model_name
        self._client = triton_grpc.InferenceServerClient(grpc_address)
        self._request_ids = itertools.count()

    async def stream(self, job_payload: bytes) -> AsyncGenerator[bytes, None]:
        """Send an encoded job; yield each encoded chunk the model returns, in order."""
        job_input = triton_grpc.InferInput(JOB_INPUT, [1], "BYTES")
        job_input.set_data_from_numpy(np.array([job_payload], dtype=np.object_))
        request = {
            "model_name": self.model_name,
            "inputs": [job_input],
            "outputs": [triton_grpc.InferRequestedOutput(CHUNK_OUTPUT)],
            "request_id": str(next(self._request_ids)),
        }

        async def one_request() -> AsyncIterator[dict[str, Any]]:
            yield request

        async for result, error in self._client.stream_infer(one_request()):
            if error is not None:
                raise error
            chunk = result.as_numpy(CHUNK_OUTPUT)
            if chunk is not None:  # Triton may close a decoupled stream with an empty response
                yield bytes(chunk[0])

    async def close(self) -> None:
        """Close the gRPC channel."""
        await self._client.close()
