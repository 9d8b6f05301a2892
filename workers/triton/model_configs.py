"""What each of the worker's Triton models says of itself: its `config.pbtxt`, as `workers.triton.host`
writes it into Triton's model repository (`model_folders`) beside what runs the model: the worker's own
backend (`native_backend`), or Triton's Python backend with `generator.backend` (a generator) or
`pooling.backend` (a pooling model) as its `model.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

from switchboard.config import BatchingConfig
from workers.triton import native_backend
from workers.triton.generator import backend as generator_backend
from workers.triton.pooling import backend as pooling_backend


def generator_config(name: str, job_socket: Path) -> str:
    """A generator's Triton config on Triton's Python backend (`generator.backend` as its stub; the
    socket's path a parameter of the model)."""
    socket = f'parameters {{ key: "{generator_backend.SOCKET_PARAMETER}" value {{ string_value: {json.dumps(str(job_socket))} }} }}'
    return _generator_config(name, "python", [socket])


def native_generator_config(name: str) -> str:
    """A generator's Triton config on the worker's own backend (`native_backend`; the socket's path is
    in a file of the model's folder, `model_folders.write_native`)."""
    return _generator_config(name, native_backend.BACKEND_NAME, [])


def _generator_config(name: str, backend: str, more: list[str]) -> str:
    """Decoupled (a job's request lasts as long as the job), one job per request, one instance (it only
    forwards; the engine's loop serves every request at once)."""
    tensors = generator_backend
    lines = [
        f"name: {json.dumps(name)}",
        f"backend: {json.dumps(backend)}",
        "max_batch_size: 0",
        "model_transaction_policy { decoupled: true }",
        "instance_group [ { kind: KIND_CPU count: 1 } ]",
        f'input [ {{ name: "{tensors.JOB_INPUT}" data_type: TYPE_STRING dims: [ 1 ] }} ]',
        f'output [ {{ name: "{tensors.CHUNK_OUTPUT}" data_type: TYPE_STRING dims: [ 1 ] }} ]',
        *more,
    ]
    return "\n".join(lines) + "\n"


def pooling_config(name: str, batching: BatchingConfig, batch_socket: Path) -> str:
    """A pooling model's Triton config on Triton's Python backend (`pooling.backend` as its stub; the
    socket's path a parameter of the model)."""
    socket = f'parameters {{ key: "{pooling_backend.SOCKET_PARAMETER}" value {{ string_value: {json.dumps(str(batch_socket))} }} }}'
    return _pooling_config(name, batching, "python", [socket])


def native_pooling_config(name: str, batching: BatchingConfig) -> str:
    """A pooling model's Triton config on the worker's own backend (`native_backend`; the socket's path
    is in a file of the model's folder, `model_folders.write_native`)."""
    return _pooling_config(name, batching, native_backend.BACKEND_NAME, [])


def _pooling_config(name: str, batching: BatchingConfig, backend_name: str, more: list[str]) -> str:
    """A pooling model's Triton config: rows along the batch dimension, up to `max_batch_size` per
    engine call; with batching enabled, Triton's dynamic batcher groups requests that arrive within
    `queue_delay_ms` (a batch of a preferred size leaves at once); without, each request runs alone.
    Not decoupled, `batching.instances` instances: while one's batch computes, the next is gathered
    and handed over on another (the model's process computes one batch at a time)."""
    backend = pooling_backend
    lines = [
        f"name: {json.dumps(name)}",
        f"backend: {json.dumps(backend_name)}",
        f"max_batch_size: {batching.max_batch_size}",
        f"instance_group [ {{ kind: KIND_CPU count: {batching.instances} }} ]",
        f'input [ {{ name: "{backend.ROWS_INPUT}" data_type: TYPE_STRING dims: [ 1 ] }} ]',
        "output [",
        f'  {{ name: "{backend.ANSWERS_OUTPUT}" data_type: TYPE_STRING dims: [ 1 ] }},',
        f'  {{ name: "{backend.BATCH_OUTPUT}" data_type: TYPE_INT64 dims: [ {backend.BATCH_COLUMNS} ] }}',
        "]",
        *more,
    ]
    if batching.enabled:
        preferred = ", ".join(str(size) for size in batching.preferred_batch_sizes)
        lines.append(
            f"dynamic_batching {{ max_queue_delay_microseconds: {int(batching.queue_delay_ms * 1000)}"
            + (f" preferred_batch_size: [ {preferred} ]" if preferred else "")
            + " }"
        )
    return "\n".join(lines) + "\n"
