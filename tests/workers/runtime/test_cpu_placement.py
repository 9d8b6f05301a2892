"""Splitting CPU cores between engines (VLLM_CPU_OMP_THREADS_BIND values)."""

from __future__ import annotations

import os
import threading

import pytest

from workers.runtime.cpu_placement import (
    available_cores,
    compute_cores,
    engine_threads_bind,
    keep_off_compute_cores,
    omp_environment,
    parse_cpu_list,
)


def expand(bind: str) -> list[int]:
    """ "0-2,5-5" → [0, 1, 2, 5]."""
    cores: list[int] = []
    for part in bind.split(","):
        low, _, high = part.partition("-")
        cores.extend(range(int(low), int(high) + 1))
    return cores


def test_available_cores_is_sorted_and_non_empty() -> None:
    cores = available_cores()
    assert cores
    assert cores == sorted(set(cores))


@pytest.mark.parametrize(
    ("cores", "reserved", "expected"),
    [
        ([0, 1], 1, [0]),
        ([0, 1, 2, 3, 4, 5, 6, 7], 2, [0, 1, 2, 3, 4, 5]),
        ([0, 1, 2, 3], 0, [0, 1, 2, 3]),
        ([0], 1, [0]),
        ([0, 1], 5, [0]),
        ([3, 5, 9], 1, [3, 5]),
    ],
)
def test_compute_cores(cores: list[int], reserved: int, expected: list[int]) -> None:
    assert compute_cores(cores, reserved) == expected


def test_one_engine_on_two_cores_after_reserving_one() -> None:
    assert engine_threads_bind(compute_cores([0, 1], 1), 0, 1) == "0-0"


def test_one_engine_gets_all_compute_cores() -> None:
    assert engine_threads_bind(list(range(8)), 0, 1) == "0-7"


def test_two_engines_on_eight_cores() -> None:
    cores = list(range(8))
    assert [engine_threads_bind(cores, slot, 2) for slot in range(2)] == ["0-3", "4-7"]


def test_last_engine_takes_the_remainder() -> None:
    cores = list(range(8))
    assert [engine_threads_bind(cores, slot, 3) for slot in range(3)] == ["0-1", "2-3", "4-7"]


@pytest.mark.parametrize(("n_cores", "slots"), [(8, 2), (8, 3), (7, 2), (16, 5), (6, 5), (4, 4)])
def test_shares_partition_the_cores(n_cores: int, slots: int) -> None:
    cores = list(range(n_cores))
    shares = [expand(engine_threads_bind(cores, slot, slots)) for slot in range(slots)]
    assert all(shares), "every engine gets at least one core"
    assert [c for share in shares for c in share] == cores  # contiguous, disjoint, in order, complete


def test_more_engines_than_cores_share_cores() -> None:
    cores = [0, 1]
    binds = [engine_threads_bind(cores, slot, 4) for slot in range(4)]
    assert binds == ["0-0", "1-1", "0-0", "1-1"]


def test_many_engines_on_one_core() -> None:
    assert {engine_threads_bind([2], slot, 3) for slot in range(3)} == {"2-2"}


def test_non_contiguous_cores_give_ranges() -> None:
    assert engine_threads_bind([0, 1, 2, 5, 6, 9], 0, 1) == "0-2,5-6,9-9"


def test_non_contiguous_cores_split_between_engines() -> None:
    cores = [0, 1, 4, 5, 6, 8]
    assert [engine_threads_bind(cores, slot, 2) for slot in range(2)] == ["0-1,4-4", "5-6,8-8"]


@pytest.mark.parametrize(("slot", "slots"), [(-1, 2), (2, 2), (5, 2), (0, 0), (0, -1)])
def test_invalid_slot_raises(slot: int, slots: int) -> None:
    with pytest.raises(ValueError):
        engine_threads_bind([0, 1, 2, 3], slot, slots)


@pytest.mark.parametrize(
    ("cpu_threads", "expected"),
    [
        ("0-0", [0]),
        ("0-3", [0, 1, 2, 3]),
        ("0,2-3", [0, 2, 3]),
        ("5", [5]),
        ("1, 3-4", [1, 3, 4]),
        ("2-3,0-1", [2, 3, 0, 1]),
        ("0-1,1-2", [0, 1, 2]),
    ],
)
def test_parse_cpu_list(cpu_threads: str, expected: list[int]) -> None:
    assert parse_cpu_list(cpu_threads) == expected


@pytest.mark.parametrize("cpu_threads", ["", "a", "0-", "-1", "3-1", "0,,1", "0-1-2"])
def test_parse_cpu_list_refuses_what_is_not_a_core_list(cpu_threads: str) -> None:
    with pytest.raises(ValueError):
        parse_cpu_list(cpu_threads)


def test_omp_environment_for_one_core() -> None:
    assert omp_environment("0-0") == {"OMP_NUM_THREADS": "1", "OMP_PLACES": "{0}", "OMP_PROC_BIND": "close"}


def test_omp_environment_for_non_contiguous_cores() -> None:
    env = omp_environment("0,2-3")
    assert env == {"OMP_NUM_THREADS": "3", "OMP_PLACES": "{0},{2},{3}", "OMP_PROC_BIND": "close"}


@pytest.mark.parametrize(("n_cores", "slots"), [(8, 2), (8, 3), (2, 1), (6, 5)])
def test_omp_environment_of_each_engine_share(n_cores: int, slots: int) -> None:
    cores = compute_cores(list(range(n_cores)), 1)
    for slot in range(slots):
        bind = engine_threads_bind(cores, slot, slots)
        env = omp_environment(bind)
        assert int(env["OMP_NUM_THREADS"]) == len(expand(bind))
        assert env["OMP_PLACES"] == ",".join(f"{{{core}}}" for core in expand(bind))


def test_a_worker_keeps_its_own_threads_off_the_compute_cores() -> None:
    cores = available_cores()
    seen: dict[str, object] = {}

    def in_a_thread() -> None:  # the setting is per thread: the test's own stays as it was
        seen["kept"] = keep_off_compute_cores(cores, reserved_cores=1)
        seen["affinity"] = sorted(os.sched_getaffinity(0))

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    rest = cores[len(compute_cores(cores, 1)) :]
    assert seen["kept"] == rest
    assert seen["affinity"] == (rest or cores)
    assert not set(rest) & set(compute_cores(cores, 1)), "no core both computes and serves"
    assert sorted(os.sched_getaffinity(0)) == cores
