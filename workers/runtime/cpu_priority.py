"""CPU priority of a worker's engines: a model past its share of the jobs yields the cores to the others.

Fair shares (`workers.jobs.shares`) decide which jobs run; the engines that run them still share the
machine's cores with each other and with the path around them (Triton, the worker, the front door).
Beside a flood, a quiet model's job got its slot at once but its prefill took 3-4 times as long as
alone (20 ms against 5.2, traced), and every hop of its path waited for a core behind the flood's
work: its time to first token was 4-6x its time alone beside 96 and 256 flooding clients
(bench/fair_share.py, 2 cores). So, while two or more models run jobs here, the engine processes of
a model that runs more than its share of the slots compute at a lower CPU priority
(`worker.background_nice`), and get the normal one back once the rule has left them out for
`RESTORE_AFTER_S`. The flood's engine then takes the cores the others leave, which is all of them
between the quiet model's jobs: the quiet model's work is the same, it is only done first. Measured
with fair shares on, this on against off (three alternating runs each, beside 96 and 256 clients):
the quiet model's time to first token 1.9-3.0x and 2.0-4.7x its time alone against 3.3-5.4x and
5.0-6.8x, the flood's tokens/s (medians) +10.7 % and -2.2 %.

The rule (`background_models`): while two or more models run jobs here, one of a lower `priority`
than another's is put in the background, and so is one running more jobs than its share of the
worker's slots (the slots times its weight over the weights of the held models of its priority,
as fair shares count it); a model running alone never is, nor one within its share (a flood of 32 clients on a worker of
64 slots shared by two models: put in the background beside the quiet model, it lost 6-10 % of its
tokens/s in three rounds of bench/fair_share.py, where it takes no slot from anyone). Lowering a nice
value again needs an RLIMIT_NICE of 20 (nice values from 0 up, nothing above the normal priority:
compose.yaml gives its workers that, no capability) or CAP_SYS_NICE; without either the worker says
so once and leaves every engine at the normal priority.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from workers.runtime.worker_metrics import ENGINE_BACKGROUND

logger = logging.getLogger(__name__)

# A model's engine leaves the background only once the rule has left it out this long: a quiet
# model's requests that follow each other closely (a client's next turn) do not renice the flood's
# threads twice per request.
RESTORE_AFTER_S = 0.5
NORMAL_NICE = 0


@dataclass(frozen=True)
class ModelLoad:
    """One model held here, as the CPU priorities see it."""

    name: str
    running: int
    weight: float = 1.0
    priority: int = 0


def background_models(models: Iterable[ModelLoad], total_slots: int) -> set[str]:
    """The models whose engines should compute at the background priority now, of the `models` held
    on a worker of `total_slots` job slots."""
    held = list(models)
    active = [model for model in held if model.running > 0]
    if len(active) < 2:
        return set()
    top_priority = max(model.priority for model in active)
    # Shares among the held models of that priority: a model never yields to one of a lower priority.
    weights = sum(model.weight for model in held if model.priority == top_priority)
    lower = {model.name for model in active if model.priority < top_priority}
    return lower | {
        model.name
        for model in active
        if model.priority == top_priority and model.running > total_slots * model.weight / weights
    }


def may_restore_priority() -> bool:
    """Whether this process may lower a nice value it raised (CAP_SYS_NICE, or RLIMIT_NICE allows)."""
    allowed: list[bool] = []

    def probe() -> None:
        # A throwaway thread of its own, so that a refusal leaves no thread of the worker niced.
        tid = threading.get_native_id()
        before = os.getpriority(os.PRIO_PROCESS, tid)
        try:
            os.setpriority(os.PRIO_PROCESS, tid, before + 1)
            os.setpriority(os.PRIO_PROCESS, tid, before)
            allowed.append(True)
        except PermissionError:
            allowed.append(False)

    thread = threading.Thread(target=probe, name="nice-probe")
    thread.start()
    thread.join()
    return allowed == [True]


def set_process_nice(pid: int, nice: int) -> None:
    """Set the nice value of every thread of process `pid` (Linux keeps one per thread; threads the
    process starts later inherit their starter's). A process that has ended is left alone."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return
    for tid in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)
        except ProcessLookupError:
            continue  # the thread ended meanwhile


class EnginePriorities:
    """Keeps each held model's engine processes at the normal or the background priority.

    `update` is called whenever a job starts or ends, on the worker's event loop; it reads the loads
    and the engines' processes through `loads` and `processes_of`, and renices only what changed.
    """

    def __init__(
        self,
        loads: Callable[[], Iterable[ModelLoad]],
        processes_of: Callable[[str], list[int]],
        *,
        background_nice: int,
        total_slots: int,
        enabled: bool = True,
        restore_after_s: float = RESTORE_AFTER_S,
        set_nice: Callable[[int, int], None] = set_process_nice,
    ) -> None:
        self._loads = loads
        self._processes_of = processes_of
        self._background_nice = background_nice
        self._total_slots = total_slots
        self._enabled = enabled
        self._restore_after_s = restore_after_s
        self._set_nice = set_nice
        # The processes of each model now in the background (a model's engine may be replaced).
        self._niced: dict[str, tuple[int, ...]] = {}
        # When each model in the background last stopped needing to be (loop time).
        self._calm_since: dict[str, float] = {}
        self._restore_check: asyncio.TimerHandle | None = None

    @classmethod
    def for_worker(
        cls,
        loads: Callable[[], Iterable[ModelLoad]],
        processes_of: Callable[[str], list[int]],
        *,
        background_nice: int,
        total_slots: int,
        enabled: bool,
    ) -> EnginePriorities:
        """Enabled where the worker may also give the normal priority back (it says so if not)."""
        if enabled and not may_restore_priority():
            logger.info(
                "engines keep one CPU priority: giving a model's engine its normal priority back "
                "needs RLIMIT_NICE of 20 (compose.yaml's workers have it: `ulimits: nice: 20`) or "
                "CAP_SYS_NICE; set worker.cpu_priorities = false to say nothing of it"
            )
            enabled = False
        return cls(
            loads, processes_of, background_nice=background_nice, total_slots=total_slots, enabled=enabled
        )

    @property
    def enabled(self) -> bool:
        """Whether engines are reniced (off when switched off, or once a renice was refused)."""
        return self._enabled

    def background(self) -> set[str]:
        """The models whose engines compute at the background priority now."""
        return set(self._niced)

    def update(self) -> None:
        """Put in the background the engines that should be now; schedule the return of those the
        rule no longer puts there."""
        if not self._enabled:
            return
        loads = list(self._loads())
        wanted = background_models(loads, self._total_slots)
        for name in wanted:
            self._calm_since.pop(name, None)
            processes = tuple(self._processes_of(name))
            if self._niced.get(name) != processes:
                self._renice(processes, self._background_nice)
                self._niced[name] = processes
                ENGINE_BACKGROUND.labels(name).set(1)
        held = {load.name for load in loads}
        for name in [name for name in self._niced if name not in held]:
            del self._niced[name]  # unloaded: its processes are gone, a new engine starts normal
            ENGINE_BACKGROUND.labels(name).set(0)
            self._calm_since.pop(name, None)
        now = asyncio.get_running_loop().time()
        for name in self._niced:
            if name not in wanted:
                self._calm_since.setdefault(name, now)
        self._schedule_restore()

    def _schedule_restore(self) -> None:
        if self._restore_check is not None or not self._calm_since:
            return
        due = min(self._calm_since.values()) + self._restore_after_s
        self._restore_check = asyncio.get_running_loop().call_at(due, self._restore_calm)

    def _restore_calm(self) -> None:
        """Bring back the engines whose models have been out of the background for the grace."""
        self._restore_check = None
        now = asyncio.get_running_loop().time()
        for name, since in list(self._calm_since.items()):
            if now - since >= self._restore_after_s:
                del self._calm_since[name]
                if name in self._niced:
                    self._give_back(name)
        self._schedule_restore()

    def _give_back(self, name: str) -> None:
        self._renice(self._niced.pop(name), NORMAL_NICE)
        ENGINE_BACKGROUND.labels(name).set(0)

    def _renice(self, processes: Iterable[int], nice: int) -> None:
        for pid in processes:
            try:
                self._set_nice(pid, nice)
            except OSError:
                # Refused (or /proc unreadable): the jobs go on, the engines keep the priority they have.
                logger.warning("cannot change an engine's CPU priority", extra={"pid": pid}, exc_info=True)
                self._enabled = False
                return
