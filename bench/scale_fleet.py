"""One process of simulated workers for the scale benchmark: many real `Worker`s on one event loop.

    python bench/scale_fleet.py SPEC_JSON      (started by bench/scale.py, one per process)

Each simulated worker is the product's `workers.main.Worker`, built from the same configuration file
as the front door, with its own id and `worker.models`, around the scripted engine and the in-process
Triton stand-in of `scale_sim`. Two measurement hooks change no behaviour: `ModelController.step` is
wrapped to time every controller pass, and a log handler notes each action the controller commits
(its records carry `action` and `model`). On SIGTERM the process writes what it recorded to the
spec's `out` file, then stops its workers as a worker process would.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec
from scale_sim import EngineScript, ScaleEngines, StandInNotUsed, current_worker, hosts_made, install

from switchboard import keys
from switchboard.config import Settings, load_settings
from switchboard.logs import configure_logging
from workers.controller.loop import ModelController
from workers.main import Worker

# A worker's stop under load can take longer than a grid point should wait (see bench/README.md): past
# this, the process leaves without it, after its records are written.
STOP_TIMEOUT_S = 3.0
CONTROLLER_LOGGER = "workers.controller.loop"


@dataclass(frozen=True)
class FleetSpec:
    """What one fleet process runs; passed to it as JSON."""

    config: str  # the stack's TOML file, the same one the front doors read
    redis_url: str
    worker_models: list[list[str]]  # one entry per simulated worker: the models it may hold ([] = all)
    load_s: tuple[float, float]
    token_s: float
    memory_bytes: int
    out: str  # where the recorded events go, as JSON
    log: str  # the process's log file

    def to_json(self) -> str:
        """The spec as one command-line argument."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> FleetSpec:
        """The spec back from its argument."""
        fields = json.loads(text)
        fields["load_s"] = tuple(fields["load_s"])
        return cls(**fields)


class Recorder:
    """Controller passes and load decisions of every worker in this process, in unix seconds."""

    def __init__(self) -> None:
        self.passes: list[tuple[float, float]] = []  # (began, seconds)
        self.actions: list[tuple[str, str, str, float]] = []  # (worker, action, model, committed at)

    def time_passes(self) -> None:
        """Wrap `ModelController.step` to time it (a measurement only: the pass itself is untouched)."""
        if not hasattr(ModelController, "step"):
            logging.getLogger("scale_fleet").warning("ModelController has no step(): passes are not timed")
            return
        original: Callable[[ModelController], Awaitable[None]] = ModelController.step
        passes = self.passes

        async def timed_step(controller: ModelController) -> None:
            began_at, began = time.time(), time.perf_counter()
            try:
                await original(controller)
            finally:
                passes.append((began_at, time.perf_counter() - began))

        ModelController.step = timed_step  # type: ignore[method-assign,assignment]

    def note_actions(self) -> None:
        """Keep each committed action (from the controller's own log record) with the worker it names."""
        handler = _ActionHandler(self.actions)
        controller_log = logging.getLogger(CONTROLLER_LOGGER)
        controller_log.setLevel(logging.INFO)
        controller_log.addHandler(handler)
        controller_log.propagate = False


class _ActionHandler(logging.Handler):
    def __init__(self, actions: list[tuple[str, str, str, float]]) -> None:
        super().__init__()
        self._actions = actions

    def emit(self, record: logging.LogRecord) -> None:
        action = getattr(record, "action", None)
        if action is not None:
            model = str(getattr(record, "model", ""))
            self._actions.append((current_worker.get(), str(action), model, record.created))
        if record.levelno >= logging.WARNING:  # what the root's handlers would have written
            for handler in logging.getLogger().handlers:
                handler.handle(record)


def worker_settings(settings: Settings, models: list[str]) -> Settings:
    """The stack's settings for one simulated worker, which may hold `models` ([]: all)."""
    return msgspec.structs.replace(settings, worker=msgspec.structs.replace(settings.worker, models=models))


async def run_fleet(spec: FleetSpec) -> None:
    """Start the workers, serve until SIGTERM, write the records, stop the workers."""
    install()
    recorder = Recorder()
    recorder.time_passes()
    recorder.note_actions()
    settings = load_settings(Path(spec.config), environ={"REDIS_URL": spec.redis_url})
    keys.set_prefix(settings.redis.key_prefix)  # this process runs the workers
    engines = ScaleEngines(
        EngineScript(load_s=spec.load_s, token_s=spec.token_s, memory_bytes=spec.memory_bytes)
    )
    fleet = [Worker(worker_settings(settings, models), engines) for models in spec.worker_models]
    if hosts_made() != len(fleet):  # a real Triton per worker would not fit: stop before starting them
        raise StandInNotUsed(
            "workers.main.Worker did not build the in-process host: update bench/scale_sim.py"
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    cpu_before = time.process_time()
    await asyncio.gather(*(_start_as(worker) for worker in fleet))
    logging.getLogger("scale_fleet").warning(f"{len(fleet)} simulated workers started")
    await stop.wait()
    records: dict[str, Any] = {
        "workers": [worker.id for worker in fleet],
        "passes": recorder.passes,
        "actions": recorder.actions,
        "loads": engines.events.loads,
        "stops": engines.events.stops,
        "cpu_s": time.process_time() - cpu_before,
    }
    await asyncio.to_thread(Path(spec.out).write_text, json.dumps(records))
    stopping = asyncio.gather(*(worker.stop() for worker in fleet))
    done, _ = await asyncio.wait([stopping], timeout=STOP_TIMEOUT_S)
    if not done:
        logging.getLogger("scale_fleet").warning(f"workers did not stop within {STOP_TIMEOUT_S:g} s; leaving")
        logging.shutdown()
        os._exit(0)  # the records are written; tasks that do not unwind would hold the exit up as well


def _start_as(worker: Worker) -> asyncio.Task[None]:
    """Start one worker in a context that names it: every task it creates inherits the name."""
    context = contextvars.copy_context()
    context.run(current_worker.set, worker.id)
    return asyncio.get_running_loop().create_task(worker.start(), context=context)


def main(argv: list[str]) -> int:
    """Run one fleet process from its spec."""
    spec = FleetSpec.from_json(argv[0])
    configure_logging(
        os.environ.get("SCALE_FLEET_LOG_LEVEL", "WARNING"), component="fleet", log_file=Path(spec.log)
    )
    asyncio.run(run_fleet(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
