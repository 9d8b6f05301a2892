"""The path CPU benchmark's pieces (`bench/proc_cpu.py`, `cpu_accounting.py`, `pyspy_profile.py`):
reading /proc, charging CPU to requests and chunks net of the idle baseline, reading py-spy's output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cpu_accounting import (
    ENDED_THREADS,
    GroupCpu,
    LevelLoad,
    cpu_deltas,
    group_cpu,
    per_chunk_us,
    per_request_ms,
)
from path_cpu_compare import compare, comparison_json, comparison_markdown
from path_cpu_report import LOAD_GENERATOR, LevelCpu, markdown
from proc_cpu import (
    CLOCK_TICKS,
    MAIN_THREAD,
    Process,
    Snapshot,
    Thread,
    classify,
    descendants,
    parse_machine_cpu,
    parse_schedstat,
    parse_stat,
    renamed,
    snapshot,
    thread_group,
)
from pyspy_profile import parse_thread_names, py_spy_path, samples_by_thread, top_self_frames


def stat_line(pid: int, comm: str, ppid: int, utime: int, stime: int) -> str:
    """A /proc stat line as Linux writes it: 52 fields, utime and stime the 14th and 15th."""
    tail = ["S", str(ppid)] + ["0"] * 9 + [str(utime), str(stime)] + ["0"] * 37
    return f"{pid} ({comm}) " + " ".join(tail) + "\n"


def test_a_stat_line_gives_name_parent_and_cpu_even_when_the_name_holds_spaces_and_parentheses() -> None:
    stat = parse_stat(stat_line(42, "Thread-3 (worke)", 7, 150, 50))
    assert stat.comm == "Thread-3 (worke)"
    assert stat.ppid == 7
    assert stat.cpu_s == pytest.approx(200 / CLOCK_TICKS)


def test_schedstat_is_nanoseconds_on_a_cpu_and_waiting_for_one_then_runs() -> None:
    assert parse_schedstat("1500000000 25534074 12\n") == pytest.approx((1.5, 0.025534074, 12))


def test_the_machine_is_busy_for_all_but_idle_and_iowait() -> None:
    busy, every = parse_machine_cpu("cpu  100 10 50 800 40 5 5 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    assert busy == pytest.approx(170 / CLOCK_TICKS)
    assert every == pytest.approx(1010 / CLOCK_TICKS)


@pytest.mark.parametrize(
    ("argv", "comm", "kind"),
    [
        (("/usr/bin/redis-server", "127.0.0.1:6379"), "redis-server", "redis-server"),
        (("/x/tritonserver/bin/tritonserver", "--log-verbose", "0"), "tritonserver", "tritonserver"),
        (
            ("/x/python/triton_python_backend_stub", "/tmp/m/1/model.py"),
            "triton_python_b",
            "Python backend stub",
        ),
        (("VLLM::EngineCore",), "VLLM::EngineCor", "vLLM engine core"),
        (("VLLM::Worker_TP0",), "VLLM::Worker_TP", "vLLM model runner"),
        (
            (".venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"),
            "python",
            "vLLM API server",
        ),
        ((".venv/bin/vllm", "serve", "/m"), "vllm", "vLLM API server"),
        (("switchboard::engine-fork-server",), "switchboard::en", "engine fork server"),
        (("switchboard::pooling::embedder",), "switchboard::po", "pooling model process"),
        ((".venv/bin/python", "-m", "switchboard", "--config", "c.toml", "worker"), "python", "worker"),
        ((".venv/bin/python", "-m", "workers.main"), "python", "worker"),
        (
            (".venv/bin/python", "-m", "switchboard", "--config", "router.toml", "router"),
            "python",
            "front door",
        ),
        ((".venv/bin/py-spy", "record", "--pid", "1"), "py-spy", "profiler (py-spy)"),
        (("/usr/bin/sleep", "30"), "sleep", "other: sleep 30"),
    ],
)
def test_the_stacks_processes_are_told_apart_by_command_line_and_name(
    argv: tuple[str, ...], comm: str, kind: str
) -> None:
    assert classify(argv, comm) == kind


def test_threads_of_a_pool_share_a_group_and_the_first_thread_is_the_main_one() -> None:
    assert thread_group("ThreadPoolExecutor-0_3", 10, 12) == thread_group("ThreadPoolExecutor-1_0", 10, 13)
    assert thread_group("ThreadPoolExecutor-0_3", 10, 12) == "ThreadPoolExecutor-N_N"
    assert thread_group("python", 10, 10) == MAIN_THREAD


def test_the_tree_below_a_process_is_found_from_parents() -> None:
    parents = {1: 0, 10: 1, 11: 10, 12: 11, 13: 10, 20: 1}
    assert descendants(10, parents) == [10, 11, 12, 13]


def test_a_real_snapshot_finds_this_process_its_threads_and_a_child() -> None:
    child = subprocess.Popen(["sleep", "30"])
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: stop.wait(30), name="spinner")
    spinner.start()
    try:
        snap = snapshot(os.getpid(), "tests")
    finally:
        stop.set()
        spinner.join()
        child.kill()
        child.wait()
    assert snap.processes[os.getpid()].kind == "tests"
    assert snap.processes[child.pid].kind == "other: sleep 30"
    assert snap.threads[(os.getpid(), os.getpid())].cpu_s > 0
    assert {tid for pid, tid in snap.threads if pid == os.getpid()} >= {os.getpid(), spinner.native_id}


def process(pid: int, kind: str, cpu_s: float) -> Process:
    return Process(pid=pid, ppid=1, kind=kind, argv=(kind,), cpu_s=cpu_s)


def snap(processes: list[Process], threads: dict[tuple[int, int], tuple[str, float]]) -> Snapshot:
    return Snapshot(
        {p.pid: p for p in processes},
        {(pid, tid): Thread(pid, tid, name, cpu) for (pid, tid), (name, cpu) in threads.items()},
    )


def test_a_levels_cpu_is_charged_per_thread_group_less_the_idle_rate_over_the_levels_wall_time() -> None:
    # A worker whose main thread and two pool threads run; the front door's main thread polls.
    before = snap(
        [process(10, "worker", 5.0), process(20, "front door", 1.0)],
        {
            (10, 10): ("python", 2.0),
            (10, 11): ("pool-0", 1.0),
            (10, 12): ("pool-1", 1.0),
            (20, 20): ("python", 1.0),
        },
    )
    after = snap(
        [process(10, "worker", 9.0), process(20, "front door", 2.0)],
        {
            (10, 10): ("python", 3.0),
            (10, 11): ("pool-0", 2.5),
            (10, 12): ("pool-1", 2.5),
            (20, 20): ("python", 2.0),
        },
    )
    # Idle for 5 s (the level took 10 s): the front door's main thread polled 0.1 s, the rest slept.
    idle_before = snap(
        [process(20, "front door", 2.0)], {(20, 20): ("python", 2.0), (10, 10): ("python", 3.0)}
    )
    idle_after = snap(
        [process(20, "front door", 2.1)], {(20, 20): ("python", 2.1), (10, 10): ("python", 3.0)}
    )
    groups = group_cpu(cpu_deltas(before, after), cpu_deltas(idle_before, idle_after), 10.0, 5.0, after)
    by_name = {(g.kind, g.group): g for g in groups}
    assert by_name[("worker", "pool-N")].net_s == pytest.approx(3.0)
    assert by_name[("worker", "pool-N")].threads == 2
    assert by_name[("worker", MAIN_THREAD)].net_s == pytest.approx(1.0)
    assert by_name[("front door", MAIN_THREAD)].idle_s == pytest.approx(0.2)
    assert by_name[("front door", MAIN_THREAD)].net_s == pytest.approx(0.8)
    assert groups[0].group == "pool-N"  # busiest first
    assert not any(g.group == ENDED_THREADS for g in groups)  # no thread came or went: no rounding noise


def test_threads_that_ended_during_a_level_are_charged_from_their_process_counter() -> None:
    before = snap([process(10, "worker", 4.0)], {(10, 10): ("python", 2.0), (10, 11): ("short", 2.0)})
    after = snap([process(10, "worker", 7.0)], {(10, 10): ("python", 3.0), (10, 13): ("new", 0.5)})
    deltas = cpu_deltas(before, after)
    assert deltas[(10, 13)].cpu_s == pytest.approx(0.5)
    groups = group_cpu(deltas, {}, 10.0, 10.0, after)
    ended = next(g for g in groups if g.group == ENDED_THREADS)
    assert ended.net_s == pytest.approx(3.0 - 1.0 - 0.5)


def test_cpu_per_request_counts_completed_requests_and_per_chunk_every_chunk_received() -> None:
    load = LevelLoad(concurrency=32, requests=110, errors=10, chunks=1000, tokens=6400, wall_s=5.0)
    assert per_request_ms(0.5, load) == pytest.approx(5.0)
    assert per_chunk_us(0.5, load) == pytest.approx(500.0)
    empty = LevelLoad(concurrency=1, requests=2, errors=2, chunks=0, tokens=0, wall_s=1.0)
    assert per_request_ms(0.5, empty) is None
    assert per_chunk_us(0.5, empty) is None


def test_python_thread_names_replace_the_kernels() -> None:
    before = snap([process(10, "worker", 1.0)], {(10, 10): ("python", 1.0), (10, 11): ("python", 0.5)})
    named = renamed(before, {11: "inference_handler-1"})
    assert named.threads[(10, 11)].name == "inference_handler-1"
    assert named.threads[(10, 10)].name == "python"


def test_py_spy_thread_names_come_from_its_json_dump() -> None:
    dump = [
        {"thread_id": 1, "thread_name": "MainThread", "os_thread_id": 100, "frames": []},
        {"thread_id": 2, "thread_name": "inference_handler-1", "os_thread_id": 101, "frames": []},
        {"thread_id": 3, "thread_name": None, "os_thread_id": 102, "frames": []},
    ]
    assert parse_thread_names(json.dumps(dump)) == {100: "MainThread", 101: "inference_handler-1"}


COLLAPSED = """thread (100);main (app.py:10);handle (router/app.py:42) 30
thread (100);main (app.py:10);handle (router/app.py:43) 20
thread (101);run (worker.py:5);send (zmq/socket.py:7) 40
thread (101);run (worker.py:5) 10
"""


def test_top_frames_by_self_time_add_up_per_function_across_lines() -> None:
    frames = top_self_frames(COLLAPSED, 2)
    assert [(f.frame, f.samples) for f in frames] == [
        ("handle (router/app.py)", 50),
        ("send (zmq/socket.py)", 40),
    ]
    assert frames[0].share == pytest.approx(0.5)


def test_profile_samples_add_up_per_thread() -> None:
    assert samples_by_thread(COLLAPSED) == {100: 50, 101: 50}


def test_top_frames_of_some_threads_leave_the_others_out() -> None:
    frames = top_self_frames(COLLAPSED, 5, thread_ids={101})
    assert [(f.frame, f.samples) for f in frames] == [("send (zmq/socket.py)", 40), ("run (worker.py)", 10)]
    assert frames[0].share == pytest.approx(0.8)


def test_runs_on_a_core_and_waits_for_one_are_charged_net_of_the_idle_baseline() -> None:
    def one(cpu_s: float, waited_s: float, runs: int) -> Snapshot:
        return Snapshot(
            {20: process(20, "front door", cpu_s)},
            {(20, 20): Thread(20, 20, "python", cpu_s, waited_s, runs)},
        )

    level = cpu_deltas(one(1.0, 0.1, 100), one(2.0, 0.6, 1100))
    idle = cpu_deltas(one(2.0, 0.6, 1100), one(2.01, 0.61, 1150))  # 50 timer wake-ups in 5 s
    (group,) = group_cpu(level, idle, 10.0, 5.0, one(2.0, 0.6, 1100))
    assert group.net_runs == pytest.approx(900)
    assert group.net_waited_s == pytest.approx(0.48)
    load = LevelLoad(concurrency=1, requests=100, errors=0, chunks=900, tokens=6400, wall_s=10.0)
    table = markdown([LevelCpu(load, [group], 5.0, 15.0, 20.0, 10.0, 20.0, [])])
    assert "| **front door** | 9.80 | 1089 | 1.00 |" in table
    assert "| **stack total** (all but the load generator) | 9.80 | 1089 | 1.00 |" in table
    assert "waited 5.0 ms per request for a core" in table  # not net of the idle baseline


def test_without_py_spy_beside_python_or_on_the_path_there_is_none_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert py_spy_path() is None
    (tmp_path / "py-spy").write_text("")
    assert py_spy_path() == str(tmp_path / "py-spy")


def level_of(
    concurrency: int, requests: int, chunks: int, ttft_ms: float, cpu_s: dict[str, float]
) -> LevelCpu:
    """A level whose processes of each kind used `cpu_s[kind]` net of their idle baseline."""
    groups = [GroupCpu(kind=kind, group=MAIN_THREAD, level_s=seconds) for kind, seconds in cpu_s.items()]
    load = LevelLoad(concurrency, requests, errors=0, chunks=chunks, tokens=64 * requests, wall_s=10.0)
    return LevelCpu(load, groups, 10.0, 15.0, 20.0, ttft_ms, ttft_ms * 2, [])


def test_the_systems_are_compared_per_request_on_their_path_and_in_their_engine() -> None:
    switchboard = [
        level_of(
            1,
            100,
            1600,
            15.0,
            {
                "front door": 1.0,
                "redis-server": 0.3,
                "worker": 4.1,
                "tritonserver": 0.1,
                "Python backend stub": 0.1,
                "vLLM engine core": 16.0,
                LOAD_GENERATOR: 1.6,  # not the stack's
            },
        ),
        level_of(64, 200, 1400, 250.0, {"front door": 1.0, "worker": 1.0, "vLLM engine core": 3.0}),
    ]
    vllm = [
        level_of(
            1,
            100,
            6600,
            10.0,
            {
                "vLLM API server": 4.0,
                "vLLM engine core": 14.0,
                "vLLM model runner": 22.0,
                LOAD_GENERATOR: 4.0,
            },
        ),
        level_of(32, 128, 8000, 80.0, {"vLLM API server": 1.0, "vLLM engine core": 2.0}),
    ]
    (row,) = compare(switchboard, vllm)  # only the levels both ran
    assert row.concurrency == 1
    assert row.switchboard.path_ms == pytest.approx(56.0)  # 5.6 s over 100 requests
    assert row.switchboard.engine_ms == pytest.approx(160.0)
    assert row.vllm.path_ms == pytest.approx(40.0)
    assert row.vllm.engine_ms == pytest.approx(360.0)  # its model runner is the engine's too
    assert (row.switchboard.chunks_per_request, row.vllm.chunks_per_request) == (16.0, 66.0)
    assert row.ratio("path_ms") == 1.4 and row.ratio("ttft_p50_ms") == 1.5
    assert row.ratio("stack_ms") == 0.54  # 216 / 400
    table = comparison_markdown([row])
    assert (
        "| 1 | 15.0 / 10.0 | 1.50 | 16.0 / 66.0 | 56.00 / 40.00 | 1.40 | 160.00 / 360.00 | 216.00 / 400.00 | 0.54 |"
        in table
    )
    (saved,) = comparison_json([row])
    assert saved["ratios"] == {"ttft_p50_ms": 1.5, "path_ms": 1.4, "stack_ms": 0.54}
    assert saved["vllm"]["stack_ms"] == pytest.approx(400.0)
