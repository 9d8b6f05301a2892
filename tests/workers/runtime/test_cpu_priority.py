"""CPU priorities of a worker's engines (`workers.runtime.cpu_priority`): the rule, and real processes
reniced thread by thread, put back after the grace, and never when not allowed to."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import pytest

from switchboard.metrics import REGISTRY
from tests.support.nice_values import process_nice
from workers.runtime.cpu_priority import (
    EnginePriorities,
    ModelLoad,
    background_models,
    may_restore_priority,
    set_process_nice,
)

BACKGROUND = 10
SLOTS = 8  # "flood" runs 7 jobs beside "quiet": past its share of 4
GRACE_S = 0.2
# A stand-in for an engine's process: a few threads that only wait.
THREADED_CHILD = (
    "import threading, time\n"
    "for _ in range(3): threading.Thread(target=time.sleep, args=(120,), daemon=True).start()\n"
    "print('ready', flush=True); time.sleep(120)\n"
)


@pytest.mark.parametrize(
    ("loads", "slots", "expected"),
    [
        pytest.param([ModelLoad("flood", 63)], 64, set(), id="a model alone is never in the background"),
        pytest.param([ModelLoad("flood", 63), ModelLoad("quiet", 0)], 64, set(), id="the other runs nothing"),
        pytest.param([ModelLoad("flood", 63), ModelLoad("quiet", 1)], 64, {"flood"}, id="past its share"),
        pytest.param(
            [ModelLoad("flood", 32), ModelLoad("quiet", 1)], 64, set(), id="most of the jobs, in its share"
        ),
        pytest.param([ModelLoad("a", 32), ModelLoad("b", 32)], 64, set(), id="equal loads"),
        pytest.param([ModelLoad("a", 40), ModelLoad("b", 24)], 64, {"a"}, id="the larger of two floods"),
        pytest.param(
            [ModelLoad("a", 45, weight=3.0), ModelLoad("b", 15)], 64, set(), id="within a weighted share"
        ),
        pytest.param(
            [ModelLoad("a", 1, priority=0), ModelLoad("b", 60, priority=1)],
            64,
            {"a"},
            id="a lower priority, whatever the loads",
        ),
        pytest.param(
            [ModelLoad("a", 9), ModelLoad("b", 1), ModelLoad("c", 0)], 12, {"a"}, id="held models share"
        ),
    ],
)
def test_the_rule_puts_in_the_background_a_model_past_its_share_of_the_slots_or_of_a_lower_priority(
    loads: list[ModelLoad], slots: int, expected: set[str]
) -> None:
    assert background_models(loads, slots) == expected


@pytest.fixture
def engines() -> Iterator[dict[str, int]]:
    """Processes of four threads each, as "flood" and "quiet"'s engines, and a spare."""
    if not may_restore_priority():
        pytest.skip("lowering a nice value needs CAP_SYS_NICE, which this process lacks")
    children = {
        name: subprocess.Popen([sys.executable, "-c", THREADED_CHILD], stdout=subprocess.PIPE, text=True)
        for name in ("flood", "quiet", "spare")
    }
    for child in children.values():
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    try:
        yield {name: child.pid for name, child in children.items()}
    finally:
        for child in children.values():
            child.kill()
            child.wait()


def background_gauge(model: str) -> float | None:
    return REGISTRY.get_sample_value("switchboard:engine_background", {"model": model})


class Loads:
    """Jobs running per model, as the test sets them."""

    def __init__(self) -> None:
        self.running = {"flood": 0, "quiet": 0}

    def __call__(self) -> list[ModelLoad]:
        return [ModelLoad(name, count) for name, count in self.running.items()]


def priorities_of(loads: Loads, pids: dict[str, int], calls: list[tuple[int, int]]) -> EnginePriorities:
    def counted(pid: int, nice: int) -> None:
        calls.append((pid, nice))
        set_process_nice(pid, nice)

    return EnginePriorities(
        loads,
        lambda name: [pids[name]],
        background_nice=BACKGROUND,
        total_slots=SLOTS,
        restore_after_s=GRACE_S,
        set_nice=counted,
    )


async def test_a_flood_beside_a_quiet_model_computes_in_the_background_until_the_grace_has_passed(
    engines: dict[str, int],
) -> None:
    loads, calls = Loads(), []
    priorities = priorities_of(loads, engines, calls)
    loads.running["flood"] = 7
    priorities.update()
    assert process_nice(engines["flood"]) == [0] * 4  # alone: nothing to yield to

    loads.running["quiet"] = 1
    priorities.update()
    assert process_nice(engines["flood"]) == [BACKGROUND] * 4  # every thread, not only the first
    assert process_nice(engines["quiet"]) == [0] * 4
    assert priorities.background() == {"flood"}
    assert background_gauge("flood") == 1 and background_gauge("quiet") in (None, 0)

    # The quiet job ends and the next one comes within the grace: the flood stays put, unreniced.
    loads.running["quiet"] = 0
    priorities.update()
    await asyncio.sleep(GRACE_S / 4)
    loads.running["quiet"] = 1
    priorities.update()
    assert process_nice(engines["flood"]) == [BACKGROUND] * 4
    assert calls == [(engines["flood"], BACKGROUND)]

    # The quiet model stops: once the grace has passed, the flood has the normal priority back.
    loads.running["quiet"] = 0
    priorities.update()
    assert process_nice(engines["flood"]) == [BACKGROUND] * 4
    await asyncio.sleep(GRACE_S * 2)
    assert process_nice(engines["flood"]) == [0] * 4
    assert priorities.background() == set()
    assert background_gauge("flood") == 0
    assert calls == [(engines["flood"], BACKGROUND), (engines["flood"], 0)]


async def test_a_new_engine_of_a_model_in_the_background_is_put_there_too(engines: dict[str, int]) -> None:
    loads, calls = Loads(), []
    pids = {"flood": engines["flood"], "quiet": engines["quiet"]}
    priorities = priorities_of(loads, pids, calls)
    loads.running.update(flood=7, quiet=1)
    priorities.update()
    pids["flood"] = engines["spare"]  # the flood's engine started again, as another process
    loads.running["flood"] = 8
    priorities.update()
    assert process_nice(engines["spare"]) == [BACKGROUND] * 4


async def test_an_unloaded_model_is_forgotten_and_its_next_engine_is_judged_anew(
    engines: dict[str, int],
) -> None:
    loads, calls = Loads(), []
    priorities = priorities_of(loads, engines, calls)
    loads.running.update(flood=7, quiet=1)
    priorities.update()
    assert priorities.background() == {"flood"}
    del loads.running["flood"]  # unloaded: its processes end with it
    priorities.update()
    assert priorities.background() == set()
    assert background_gauge("flood") == 0
    loads.running["flood"] = 7  # loaded again: a new engine, which starts at the normal priority
    priorities.update()
    assert priorities.background() == {"flood"}
    assert calls == [(engines["flood"], BACKGROUND)] * 2, "reniced again, not taken for still niced"


async def test_switched_off_nothing_is_reniced(engines: dict[str, int]) -> None:
    loads = Loads()
    priorities = EnginePriorities(
        loads, lambda name: [engines[name]], background_nice=BACKGROUND, total_slots=SLOTS, enabled=False
    )
    loads.running.update(flood=7, quiet=1)
    priorities.update()
    assert process_nice(engines["flood"]) == [0] * 4
    assert priorities.background() == set()


async def test_a_refusal_to_renice_switches_the_priorities_off_without_failing_the_job() -> None:
    loads = Loads()

    def refuse(pid: int, nice: int) -> None:
        raise PermissionError("not allowed")

    priorities = EnginePriorities(
        loads, lambda name: [4242], background_nice=BACKGROUND, total_slots=SLOTS, set_nice=refuse
    )
    loads.running.update(flood=7, quiet=1)
    priorities.update()  # logs, does not raise
    loads.running["quiet"] = 2
    priorities.update()
    assert not priorities.enabled
