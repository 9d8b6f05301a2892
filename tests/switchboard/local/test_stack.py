"""`switchboard up` on fake components: what its terminal shows, and that a dying part stops it all."""

from __future__ import annotations

import functools
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.exceptions import AuthenticationError

from switchboard.config import ModelConfig, Settings, load_settings
from switchboard.local import stack
from switchboard.local.launcher import Launcher
from switchboard.local.start_report import LAST_START_FILE
from switchboard.ports import free_port

FAKE = (sys.executable, str(Path(__file__).parents[2] / "support" / "fake_component.py"))

CONFIG = """
[redis]
url = "redis://127.0.0.1:1/0"

[[models]]
name = "first-model"
path = "/models/first"

[[models]]
name = "second-model"
path = "/models/second"
preload = true
"""


def test_up_says_where_logs_are_when_it_serves_and_how_to_call_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    env = {**os.environ, "FAKE_EVENTS": str(tmp_path / "events"), "FAKE_WORKER_EXIT_AFTER_READY": "5"}
    monkeypatch.setattr(stack, "Launcher", functools.partial(Launcher, argv_prefix=FAKE, env=env))
    config = tmp_path / "switchboard.toml"
    config.write_text(CONFIG)
    settings = load_settings(config, environ={})
    settings.router.port = port = free_port()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    code = stack.run_stack(
        settings, config_path=config, log_level="INFO", workers=2, log_dir=tmp_path / "logs"
    )

    out, err = capfd.readouterr()
    assert code == 1  # a worker exited (as the fake was told to, once the stack served)
    assert f"• Logs: worker-1.log, worker-2.log, router.log in {tmp_path / 'logs'}" in out
    assert "• Starting 2 workers and the front door ..." in out
    assert "• Serving after" in out
    assert f"Switchboard is serving first-model, second-model at http://localhost:{port}/v1" in out
    assert f"curl http://localhost:{port}/v1/chat/completions" in out
    assert '"model": "first-model"' in out
    assert f"`switchboard models --url http://127.0.0.1:{port}` shows their state" in out
    assert "Loading now (preload = true): second-model." in out
    assert "• Stopping ..." in out
    assert "exited with code 5" in err
    assert (tmp_path / "logs" / "router.log").is_file()
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers  # left as it found them


DRIVER = """
import functools, sys
from pathlib import Path
from switchboard.config import ModelConfig, Settings, load_settings
from switchboard.local import stack
from switchboard.local.launcher import Launcher
from switchboard.local.start_report import LAST_START_FILE

fake, config, port, logs = sys.argv[1:5]
stack.Launcher = functools.partial(Launcher, argv_prefix=(sys.executable, fake))
settings = load_settings(Path(config), environ={})
settings.router.port = int(port)
sys.exit(stack.run_stack(settings, config_path=Path(config), log_level="INFO", workers=2, log_dir=Path(logs)))
"""


def test_up_serves_once_the_engines_are_prepared_counting_down_from_the_last_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A first request right after "Serving" must not wait for Triton or the engine's import."""
    env = {
        **os.environ,
        "FAKE_EVENTS": str(tmp_path / "events"),
        "FAKE_PREPARING_S": "2",
        "FAKE_WORKER_EXIT_AFTER_READY": "5",
    }
    monkeypatch.setattr(stack, "Launcher", functools.partial(Launcher, argv_prefix=FAKE, env=env))
    config = tmp_path / "switchboard.toml"
    config.write_text(CONFIG)
    settings = load_settings(config, environ={})
    settings.router.port = free_port()
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / LAST_START_FILE).write_text("12.3\n")  # the last start served after 12 s
    started = time.monotonic()

    stack.run_stack(settings, config_path=config, log_level="INFO", log_dir=logs)

    out, _ = capfd.readouterr()
    lines = out.splitlines()
    (preparing,) = [i for i, line in enumerate(lines) if line.startswith("• Preparing the engines")]
    assert "(the last start here served after 12 s)" in lines[preparing]
    (serving,) = [i for i, line in enumerate(lines) if line.startswith("• Serving after")]
    assert preparing < serving
    assert int(lines[serving].split()[3]) >= 2
    assert "router ready" in (tmp_path / "events").read_text()
    assert 2 <= float((logs / LAST_START_FILE).read_text()) <= time.monotonic() - started


def test_up_killed_outright_leaves_no_component_or_redis_behind(tmp_path: Path) -> None:
    import subprocess
    import time

    import psutil

    config = tmp_path / "switchboard.toml"
    # A private redis-server, keeping its file in the test's folder.
    config.write_text(
        CONFIG.replace('url = "redis://127.0.0.1:1/0"', f'private_dir = "{tmp_path / "redis"}"')
    )
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "FAKE_EVENTS": str(tmp_path / "events")}
    up = subprocess.Popen(
        [sys.executable, str(driver), FAKE[1], str(config), str(free_port()), str(tmp_path / "logs")],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert up.stdout is not None
        deadline = time.monotonic() + 60
        shown = [up.stdout.readline()]
        while "Serving after" not in shown[-1]:
            assert time.monotonic() < deadline and up.poll() is None, "the stack did not serve"
            shown.append(up.stdout.readline())
        children = psutil.Process(up.pid).children(recursive=True)
        names = sorted(" ".join(child.cmdline()[:3]) for child in children)
        assert len(children) == 4, names  # redis-server, two workers, the front door
        assert any("redis-server" in name for name in names)
        password = _the_private_redis_is_for_this_user_alone(up.pid, children, tmp_path)
        assert any("Redis: private redis-server at redis://127.0.0.1:" in line for line in shown), shown
        assert password not in "".join(shown)
        # What the operator is told to use for `switchboard keys` reaches this Redis.
        (told,) = [line for line in shown if "export REDIS_URL_FILE=" in line]
        url_file = told.split("export REDIS_URL_FILE=", 1)[1].strip()
        with redis.Redis.from_url(Path(url_file).read_text().strip()) as client:
            assert client.ping()
        up.kill()  # SIGKILL: `up` cannot stop anything itself
        up.wait()
        _, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, [" ".join(process.cmdline()) for process in alive]
    finally:
        if up.poll() is None:
            up.kill()


def _the_private_redis_is_for_this_user_alone(up_pid: int, children: list[Any], tmp_path: Path) -> str:
    """Other local users can neither use the stack's Redis nor read its files or its password
    (returned, for the caller's own checks)."""
    import psutil

    workers = [
        child for child in children if child.environ().get("SWITCHBOARD_LOG_LABEL", "").startswith("worker")
    ]
    url_file = Path(workers[0].environ()["REDIS_URL_FILE"])
    url = url_file.read_text().strip()
    password = redis.connection.parse_url(url)["password"]
    assert len(password) >= 32
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with redis.Redis(port=port) as stranger, pytest.raises(AuthenticationError):
        stranger.set("sb:key:mine", "admin")  # minting an admin key, say
    # The components were given the file, not the password, and reached Redis with it.
    events = (tmp_path / "events").read_text()
    assert events.count("redis answered") == 2, events
    for process in [psutil.Process(up_pid), *children]:
        assert password not in " ".join(process.cmdline()), process.cmdline()
        assert password not in str(process.environ())
    assert stat.S_IMODE(url_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(url_file.parent.stat().st_mode) == 0o700
    folder = tmp_path / "redis"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    kept = [path for path in folder.rglob("*") if path.is_file()]
    assert any("appendonly" in path.name for path in kept), kept
    for path in kept:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    return str(password)


def test_the_private_redis_folder_is_held_by_one_run_at_a_time(tmp_path: Path) -> None:
    folder = tmp_path / "redis"
    with stack.private_redis_dir(str(folder)) as first:
        assert first == str(folder) and folder.is_dir()
        with stack.private_redis_dir(str(folder)) as second:
            assert second is None  # a second run keeps nothing rather than share the file
    with stack.private_redis_dir(str(folder)) as again:
        assert again == str(folder)
    with stack.private_redis_dir("") as nothing:
        assert nothing is None


def test_ctrl_c_stops_the_front_door_then_the_workers_then_redis_quietly(tmp_path: Path) -> None:
    """Ctrl-C reaches the terminal's whole foreground process group: `up` stops everything in
    order, while the workers can still reach Redis, and says nothing alarming."""
    import psutil

    config = tmp_path / "switchboard.toml"
    config.write_text(CONFIG.replace('url = "redis://127.0.0.1:1/0"', ""))  # a private redis-server
    events = tmp_path / "events"
    env = {"FAKE_EVENTS": str(events), "FAKE_STOP_DELAY_S": "1"}
    up, _ = _start_up_as_a_terminal_would(tmp_path, config, env)
    try:
        children = psutil.Process(up.pid).children(recursive=True)
        (redis_server,) = [child for child in children if "redis-server" in " ".join(child.cmdline())]
        _wait_until(lambda: events.read_text().count(" running") == 2, "the workers to handle SIGTERM")
        os.killpg(up.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
        out, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, err
    for noise in ("ERROR", "WARNING", "Traceback", "Error"):
        assert noise not in err, err
    assert "• Stopping ..." in out
    stops = [line for line in events.read_text().splitlines() if "stop" in line]
    assert stops[0] == "router stopped", stops
    # Each worker still reached Redis while it stopped (it withdraws its record then).
    assert sorted(stops[1:]) == sorted(
        [
            f"{worker} {what}"
            for worker in ("worker-1", "worker-2")
            for what in ("redis answered on stop", "stopped")
        ]
    ), stops
    assert not redis_server.is_running()  # and Redis stopped last, with `up`
    assert not [child for child in children if child.is_running()]


def _start_up_as_a_terminal_would(
    tmp_path: Path, config: Path, env: dict[str, str]
) -> tuple[subprocess.Popen[str], list[str]]:
    """`up` (on fake components) leading a session of its own, as a shell runs a command in the
    foreground; returns it once it says it serves, with the lines it printed."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    up = subprocess.Popen(
        [sys.executable, str(driver), FAKE[1], str(config), str(free_port()), str(tmp_path / "logs")],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert up.stdout is not None
    deadline = time.monotonic() + 60
    shown = [up.stdout.readline()]
    while "Serving after" not in shown[-1]:
        assert time.monotonic() < deadline and up.poll() is None, f"the stack did not serve: {shown}"
        shown.append(up.stdout.readline())
    return up, shown


def _wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_start_examples_chat_with_a_generator_and_embed_with_an_embedder(
    capsys: pytest.CaptureFixture[str],
) -> None:
    embedder = ModelConfig(name="emb", path="/m/emb", kind="embed")
    stack._print_examples(Settings(models=[embedder, ModelConfig(name="chat", path="/m/chat")]))
    shown = capsys.readouterr().out
    assert '"model": "chat", "messages"' in shown and 'model="chat"' in shown
    assert "/v1/embeddings" in shown and '"model": "emb", "input"' in shown
    stack._print_examples(Settings(models=[embedder]))
    alone = capsys.readouterr().out
    assert "chat/completions" not in alone and '"model": "emb", "input"' in alone
