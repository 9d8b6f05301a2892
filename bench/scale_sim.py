"""What the scale benchmark simulates in a worker: the engine, and the hop through the worker's Triton.

Everything else in a simulated worker is the product's own code (`workers.main.Worker`): controller,
consumer, job runner, result writer, heartbeat, slots. Two stand-ins replace what a hundred workers
on one small machine cannot run:

- `ScaleEngine`, a scripted engine: a load sleeps for a time drawn per model from a range, a request
  streams `max_tokens` tokens at a fixed pace, and it reports a fixed footprint. It notes when each
  load begins and ends and when it stops, for the benchmark's load-storm and cold-start figures.
- `InProcessHost` and `InProcessJobClient` instead of `TritonHost` and `TritonJobClient`: binding a
  model wraps its engine in the product's real `GeneratorModel` (the decoupled Triton model with its
  coalescer) driven on the worker's own event loop, and a job goes straight into that callable instead
  of over gRPC into a Triton process. `install()` puts them where `workers.main` and
  `workers.models.slot` look them up; no product code changes.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field

import workers.main
import workers.models.slot
from switchboard.config import ModelConfig, triton_model_name
from workers.engines.base import Delta, Engine, EngineRequest, Footprint
from workers.engines.registry import EngineOptions
from workers.triton.generator.model import CoalescingPolicy, GeneratorModel

# Which simulated worker the running code belongs to: set before each worker starts, inherited by
# every task it creates, so that records made deep inside (a load, a controller pass) name it.
current_worker: contextvars.ContextVar[str] = contextvars.ContextVar("current_worker", default="")


@dataclass
class EngineEvents:
    """What the scripted engines of one process did, in unix seconds."""

    # (worker, model, load began, load ended or None if it never ended)
    loads: list[tuple[str, str, float, float | None]] = field(default_factory=list)
    # (worker, model, stopped at): the model left that worker
    stops: list[tuple[str, str, float]] = field(default_factory=list)


@dataclass(frozen=True)
class EngineScript:
    """How every scripted engine behaves."""

    load_s: tuple[float, float]  # a model's load takes a time drawn from this range, fixed per model
    token_s: float  # pause before each token
    memory_bytes: int  # footprint of a loaded model


class ScaleEngine(Engine):
    """A scripted engine: timed loads, `max_tokens` tokens at a fixed pace, a fixed footprint."""

    def __init__(self, model: ModelConfig, script: EngineScript, events: EngineEvents) -> None:
        super().__init__(model)
        self._script = script
        self._events = events
        self._load_s = random.Random(model.name).uniform(*script.load_s)
        self._aborted: set[str] = set()
        self._worker = ""
        self._load_index: int | None = None

    async def start(self) -> None:
        self._worker = current_worker.get()
        self._load_index = len(self._events.loads)
        self._events.loads.append((self._worker, self.model.name, time.time(), None))
        await asyncio.sleep(self._load_s)
        worker, model, began, _ = self._events.loads[self._load_index]
        self._events.loads[self._load_index] = (worker, model, began, time.time())

    async def generate(self, request: EngineRequest) -> AsyncIterator[Delta]:
        count = request.sampling.max_tokens or 16
        for index in range(count):
            if request.request_id in self._aborted:
                self._aborted.discard(request.request_id)
                yield Delta(
                    text="", prompt_tokens=3, completion_tokens=index, finish_reason="abort", last=True
                )
                return
            await asyncio.sleep(self._script.token_s)
            last = index == count - 1
            yield Delta(
                text=f"t{index} ",
                prompt_tokens=3,
                completion_tokens=index + 1,
                finish_reason="length" if last else None,
                last=last,
            )

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    async def stop(self) -> None:
        if self._load_index is not None:
            self._events.stops.append((self._worker, self.model.name, time.time()))

    def footprint(self) -> Footprint:
        return Footprint(device="cpu", memory_bytes=self._script.memory_bytes)


class ScaleEngines:
    """The engine factory handed to every simulated `Worker` of a process."""

    def __init__(self, script: EngineScript) -> None:
        self.script = script
        self.events = EngineEvents()

    def __call__(self, model: ModelConfig, options: EngineOptions) -> Engine:
        return ScaleEngine(model, self.script, self.events)


# --- the Triton hop, in process ---------------------------------------------------------------------

_hosts: dict[str, InProcessHost] = {}
_addresses = itertools.count()


class InProcessHost:
    """Stands in for `TritonHost`: models are bound to the real `GeneratorModel`, on this event loop."""

    def __init__(self, *, coalescing: CoalescingPolicy) -> None:
        self.http_port = 0
        self.grpc_port = 0
        self.metrics_port = 0
        self._coalescing = coalescing
        # Made inside the running loop (the Worker is built there); binds happen in worker threads.
        self._loop = asyncio.get_running_loop()
        self._bound: dict[str, GeneratorModel] = {}
        self._address = f"in-process-{next(_addresses)}"
        _hosts[self._address] = self

    @property
    def grpc_address(self) -> str:
        """The key its job clients find it by."""
        return self._address

    def start(self) -> None:
        """Nothing to start."""

    def bind(self, model: str, engine: Engine) -> GeneratorModel:
        """Wrap the engine in the real Triton callable, driven on the worker's loop."""
        callable_ = GeneratorModel(engine, self._coalescing)
        callable_.attach_loop(self._loop)
        self._bound[triton_model_name(model)] = callable_
        return callable_

    def unbind(self, model: str) -> None:
        """Forget the model."""
        self._bound.pop(triton_model_name(model), None)

    def stop(self) -> None:
        """Forget every model and this host."""
        self._bound.clear()
        _hosts.pop(self._address, None)

    def callable_for(self, triton_model: str) -> GeneratorModel:
        """The bound callable of a model, by its Triton name."""
        return self._bound[triton_model]


def hosts_made() -> int:
    """In-process hosts alive now (one per simulated worker, once `install` took effect)."""
    return len(_hosts)


class InProcessJobClient:
    """Stands in for `TritonJobClient`: hands each encoded job to the bound callable, yields its chunks."""

    def __init__(self, grpc_address: str, model_name: str) -> None:
        self.model_name = model_name
        self._host = _hosts[grpc_address]

    async def stream(self, job_payload: bytes) -> AsyncGenerator[bytes, None]:
        """Send an encoded job; yield each encoded chunk the model returns, in order."""
        callable_ = self._host.callable_for(self.model_name)
        responses = callable_.serve(job_payload, stream=0, tag=None)
        try:
            async for response in responses:
                yield response
        finally:
            await responses.aclose()  # type: ignore[attr-defined]

    async def close(self) -> None:
        """Nothing to close."""


class StandInNotUsed(RuntimeError):
    """The product no longer builds its Triton host or job client where `install` puts the stand-ins."""


def install() -> None:
    """Make `workers.main.Worker` build the in-process host and its slots the in-process job client."""
    for module, name in ((workers.main, "TritonHost"), (workers.models.slot, "TritonJobClient")):
        if not hasattr(module, name):
            raise StandInNotUsed(f"{module.__name__} has no {name} any more: update bench/scale_sim.py")
    workers.main.TritonHost = InProcessHost  # type: ignore[attr-defined,assignment]
    workers.models.slot.TritonJobClient = InProcessJobClient  # type: ignore[attr-defined,assignment]
