"""A scripted stand-in for an engine, for unit tests of the worker's own pieces (Triton, slots, consumer).

The real engine is covered end to end in tests/e2e and tests/workers/engines.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator

from switchboard.config import ModelConfig
from workers.engines.base import Delta, Engine, EngineRequest, Footprint, InvalidEngineRequest
from workers.engines.registry import EngineOptions


class ScriptedEngine(Engine):
    """Streams deltas as the prompt says: `fast N`, `slow N SECONDS`, `hang`, `queued` (no token
    until aborted, as a request waiting in the engine's queue), `big CHARS` (one delta that long),
    `invalid`, `crash`.

    Token `i` is the text `t{i}\x00 `; a continued request goes on after the tokens of its continuation.
    """

    def __init__(
        self, *, start_s: float = 0.0, fail_start: str | None = None, max_sequences: int | None = None
    ) -> None:
        super().__init__(ModelConfig(name="scripted", path="unused"))
        self._max_sequences = max_sequences
        self.aborted: list[str] = []
        self.requests: list[str] = []
        # How many tokens each request let the engine hold (`EngineRequest.output_every`), in order.
        self.output_every: list[int] = []
        self.continuations: dict[str, str] = {}
        self.starts = 0
        self.stops = 0
        self._start_s = start_s
        self._fail_start = fail_start
        self._running: dict[str, asyncio.Event] = {}

    async def start(self) -> None:
        self.starts += 1
        await asyncio.sleep(self._start_s)
        if self._fail_start is not None:
            raise RuntimeError(self._fail_start)

    async def generate(self, request: EngineRequest) -> AsyncIterator[Delta]:
        self.requests.append(request.request_id)
        self.output_every.append(request.output_every)
        words = request.prompt.split() if isinstance(request.prompt, str) else ["fast"]
        abort = self._running[request.request_id] = asyncio.Event()
        if words[0] == "invalid":
            raise InvalidEngineRequest("The prompt is too long.")
        if words[0] == "crash":
            raise RuntimeError("out of memory")
        if words[0] == "big":
            yield Delta(
                text="x" * int(words[1]),
                prompt_tokens=3,
                completion_tokens=1,
                finish_reason="length",
                last=True,
            )
            return
        if words[0] == "queued":
            await abort.wait()
            yield Delta(text="", prompt_tokens=3, completion_tokens=0, finish_reason="abort", last=True)
            return
        count = int(words[1]) if len(words) > 1 else 1_000_000
        pause = float(words[2]) if len(words) > 2 else (0.0 if words[0] == "fast" else 0.01)
        done = 0
        if request.continuation is not None:
            self.continuations[request.request_id] = request.continuation
            done = request.continuation.count("\x00")
        for index in range(done, count):
            if abort.is_set():
                yield Delta(
                    text="", prompt_tokens=3, completion_tokens=index, finish_reason="abort", last=True
                )
                return
            await asyncio.sleep(pause)
            last = index == count - 1
            # "\x00" inside the text checks that bytes survive Triton untouched.
            yield Delta(
                text=f"t{index}\x00 ",
                prompt_tokens=3,
                completion_tokens=index + 1,
                finish_reason="length" if last else None,
                last=last,
            )

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self._running[request_id].set()

    async def stop(self) -> None:
        self.stops += 1

    def footprint(self) -> Footprint:
        return Footprint(device="cpu", memory_bytes=1024**2)

    def max_sequences(self) -> int | None:
        return self._max_sequences


class SleepyEngine(ScriptedEngine):
    """A scripted engine with a sleep mode, as vLLM has on GPUs."""

    def __init__(self) -> None:
        super().__init__()
        self.asleep = False
        self.sleeps = 0
        self.wakes = 0

    @property
    def supports_sleep(self) -> bool:
        return True

    async def sleep(self) -> None:
        self.sleeps += 1
        self.asleep = True

    async def wake(self) -> None:
        self.wakes += 1
        self.asleep = False


class Engines:
    """Makes scripted engines and remembers them, per model, across workers."""

    def __init__(self, start_s: float = 0.2, fail: dict[str, str] | None = None) -> None:
        self.start_s = start_s
        self.fail = fail or {}
        self.made: dict[str, list[ScriptedEngine]] = defaultdict(list)

    def __call__(self, model: ModelConfig, options: EngineOptions) -> Engine:
        engine = ScriptedEngine(start_s=self.start_s, fail_start=self.fail.get(model.name))
        self.made[model.name].append(engine)
        return engine

    def starts(self, model: str) -> int:
        return sum(engine.starts for engine in self.made[model])

    def stops(self, model: str) -> int:
        return sum(engine.stops for engine in self.made[model])
