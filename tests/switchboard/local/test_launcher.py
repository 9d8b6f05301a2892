"""The launcher against fake components: readiness, failing fast, serving, stopping in reverse."""

from __future__ import annotations

import os
import signal
import stat
import sys
import time
from pathlib import Path

import pytest

from switchboard.local.launcher import ComponentExited, Launcher, LauncherError, NotReady
from switchboard.ports import free_port
from switchboard.readiness import NO_LIVE_WORKER, WAITING_FOR

FAKE = (sys.executable, str(Path(__file__).parents[2] / "support" / "fake_component.py"))


def _launcher(tmp_path: Path, workers: int = 1, **env: str) -> Launcher:
    return Launcher(
        port=free_port(),
        log_dir=tmp_path / "logs",
        workers=workers,
        config_path=tmp_path / "switchboard.toml",
        env={**os.environ, "FAKE_EVENTS": str(tmp_path / "events"), **env},
        redis_url="redis://127.0.0.1:1/0",
        argv_prefix=FAKE,
        console=tmp_path / "console.log",
        stop_timeout_s=10,
    )


def _events(tmp_path: Path) -> list[str]:
    return (tmp_path / "events").read_text().splitlines()


def _wait_for_event(tmp_path: Path, line: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while line not in _events(tmp_path):
        assert time.monotonic() < deadline, f"no {line!r} in {_events(tmp_path)}"
        time.sleep(0.02)


def test_waits_for_readyz_reporting_progress_then_stops_the_front_door_first(tmp_path: Path) -> None:
    progress: list[str] = []
    launcher = _launcher(tmp_path, workers=2, FAKE_NOT_READY_TIMES="3")
    with launcher:
        launcher.wait_ready(
            60, progress=lambda _s, waiting_for: progress.append(waiting_for), progress_every_s=0
        )
        assert [c.name for c in launcher.components] == ["worker-1", "worker-2", "router"]
        assert all(c.alive() for c in launcher.components)
        _wait_for_event(tmp_path, "worker-1 running")
        _wait_for_event(tmp_path, "worker-2 running")
    assert WAITING_FOR[NO_LIVE_WORKER] in progress
    assert all(not c.alive() for c in launcher.components)
    stops = [line for line in _events(tmp_path) if line.endswith("stopped")]
    assert stops[0] == "router stopped"  # the front door has stopped before any worker is told to
    assert sorted(stops[1:]) == ["worker-1 stopped", "worker-2 stopped"]


def test_waits_until_every_worker_has_prepared_its_engines(tmp_path: Path) -> None:
    """A first request may be loaded on any worker: ready means every running one is prepared."""
    progress: list[str] = []
    launcher = _launcher(tmp_path, workers=2, FAKE_SECOND_WORKER_PREPARING_S="1.5")
    with launcher:
        launcher.wait_ready(
            60, progress=lambda _s, waiting_for: progress.append(waiting_for), progress_every_s=0
        )
        readies = [line for line in _events(tmp_path) if line.startswith("router ready")]
    assert "1 of 2 workers to prepare their engines" in progress
    assert readies[0] == "router ready with 1 prepared"
    assert readies[-1] == "router ready with 2 prepared"


def test_components_get_the_switchboard_command_line_log_files_and_environment(tmp_path: Path) -> None:
    launcher = _launcher(tmp_path)
    with launcher:
        launcher.wait_ready(60)
        worker, router = launcher.components
    assert worker.name == "worker" and worker.log_path == tmp_path / "logs" / "worker.log"
    assert router.log_path == tmp_path / "logs" / "router.log"
    first_line = worker.log_tail()[0]
    assert f"'--config', '{tmp_path / 'switchboard.toml'}'" in first_line
    assert f"'worker', '--log-file', '{worker.log_path}'" in first_line
    assert "redis=redis://127.0.0.1:1/0" in first_line
    console = (tmp_path / "console.log").read_text()
    assert "worker says hello on its terminal" in console
    assert "router says hello on its terminal" in console


def test_logs_are_this_users_alone_from_their_creation_even_where_a_run_before_left_them_open(
    tmp_path: Path,
) -> None:
    """Workers' logs quote requests: the folder is 0700 and every file 0600 as it is made, whatever
    the umask; files an earlier, less careful run left readable are made anew or closed."""
    earlier = tmp_path / "earlier"
    earlier.mkdir(mode=0o755)
    (earlier / "worker.log").write_text("an earlier run's prompt")
    (tmp_path / "console.log").write_text("an earlier run's line")
    for path in (earlier / "worker.log", tmp_path / "console.log"):
        path.chmod(0o644)
    previous_umask = os.umask(0o022)
    try:
        fresh = _launcher(tmp_path)
        fresh.log_dir = tmp_path / "new" / "logs"
        again = _launcher(tmp_path)
        again.log_dir = earlier
        for launcher in (fresh, again):
            with launcher:
                launcher.wait_ready(60)
                files = [c.log_path for c in launcher.components]
            assert _mode(launcher.log_dir) == 0o700
            assert files and all(path is not None and _mode(path) == 0o600 for path in files), files
    finally:
        os.umask(previous_umask)
    assert _mode(tmp_path / "console.log") == 0o600
    assert "an earlier run's prompt" not in (earlier / "worker.log").read_text()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_verbose_components_write_no_log_file(tmp_path: Path) -> None:
    launcher = _launcher(tmp_path)
    launcher.verbose = True
    with launcher:
        launcher.wait_ready(60)
    assert all(c.log_path is None for c in launcher.components)
    assert "'--verbose', 'worker']" in (tmp_path / "console.log").read_text()
    assert not (tmp_path / "logs" / "worker.log").exists()


def test_a_component_that_exits_fails_the_wait_at_once_with_its_log(tmp_path: Path) -> None:
    launcher = _launcher(tmp_path, FAKE_WORKER_EXIT="3", FAKE_NOT_READY_TIMES="1000000")
    started = time.monotonic()
    with launcher, pytest.raises(ComponentExited) as caught:
        launcher.wait_ready(300)
    assert time.monotonic() - started < 60  # it did not wait for the timeout
    message = str(caught.value)
    assert "worker exited with code 3" in message
    assert str(tmp_path / "logs" / "worker.log") in message
    assert "worker: giving up at once" in message


def test_a_component_ended_by_a_signal_is_named_so(tmp_path: Path) -> None:
    with _launcher(tmp_path) as launcher:
        launcher.wait_ready(60)
        router = launcher.components[-1]
        os.kill(router.pid, signal.SIGKILL)
        router.process.wait()
        with pytest.raises(ComponentExited, match="router was ended by SIGKILL"):
            launcher.check()


def test_not_ready_in_time_is_an_error_naming_what_it_waited_for(tmp_path: Path) -> None:
    with _launcher(tmp_path, FAKE_NOT_READY_TIMES="1000000") as launcher, pytest.raises(NotReady) as caught:
        launcher.wait_ready(0.5)
    assert WAITING_FOR[NO_LIVE_WORKER] in str(caught.value)


def test_wait_serving_retries_until_the_model_answers(tmp_path: Path) -> None:
    with _launcher(tmp_path, FAKE_CHAT_FAILURES="2") as launcher:
        launcher.wait_ready(60)
        launcher.wait_serving("demo", 60)
        with pytest.raises(LauncherError, match="refused"):
            launcher.wait_serving("unknown", 60)
    assert "router answered demo" in _events(tmp_path)


def test_a_killed_worker_does_not_count_as_a_failure_and_can_be_replaced(tmp_path: Path) -> None:
    with _launcher(tmp_path) as launcher:
        launcher.wait_ready(60)
        first = launcher.worker_components[0]
        first.kill()
        assert not first.alive()
        launcher.check()  # no ComponentExited: the test asked for it
        second = launcher.spawn_worker()
        assert second.name == "worker-2" and second.log_path == tmp_path / "logs" / "worker-2.log"
        launcher.wait_ready(60)
        _wait_for_event(tmp_path, "worker-2 running")
    assert "worker-2 stopped" in _events(tmp_path)


def test_stop_kills_what_ignores_sigterm_with_everything_it_started(tmp_path: Path) -> None:
    launcher = _launcher(tmp_path, FAKE_IGNORE_TERM="1", FAKE_GRANDCHILD="1")
    launcher.stop_timeout_s = 0.5
    with launcher:
        launcher.wait_ready(60)
        worker = launcher.worker_components[0]
        _wait_for_event(tmp_path, "worker running")
    grandchild = next(int(line.split()[-1]) for line in _events(tmp_path) if "grandchild" in line)
    assert launcher.stop() == []  # idempotent
    assert not worker.alive()
    assert _gone(grandchild)


def test_forced_pids_are_reported(tmp_path: Path) -> None:
    launcher = _launcher(tmp_path, FAKE_IGNORE_TERM="1")
    launcher.stop_timeout_s = 0.5
    launcher.start()
    launcher.wait_ready(60)
    worker = launcher.worker_components[0]
    _wait_for_event(tmp_path, "worker running")
    assert launcher.stop() == [worker.pid]


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    """Whether `pid` has ended (a zombie waiting for init to reap it counts as ended)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_at_least_one_worker(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        _launcher(tmp_path, workers=0).start()
