"""The command line: flags parsed, and each command wired to what runs it (nothing real is started)."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path
from typing import Any

import pytest

from switchboard.cli import main as cli
from switchboard.logs import LOG_LABEL_ENV


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What `main` asked for: its logging setup, and the command it ran, recorded instead of done."""
    seen: dict[str, Any] = {}

    def configure_logging(level: str, component: str = "", *, log_file: Path | None = None) -> None:
        seen["logging"] = {"level": level, "component": component, "log_file": log_file}

    def run_component(command: str, settings: Any) -> int:
        seen["component"] = (command, settings)
        return 0

    monkeypatch.setattr(cli, "configure_logging", configure_logging)
    monkeypatch.setattr(cli, "_run_component", run_component)
    monkeypatch.delenv(LOG_LABEL_ENV, raising=False)
    return seen


def test_up_takes_workers_log_dir_port_and_verbose() -> None:
    args = cli.parse_args(["up", "--workers", "3", "--log-dir", "/tmp/sb-logs", "--port", "9000"])
    assert (args.workers, args.log_dir, args.port, args.verbose) == (3, Path("/tmp/sb-logs"), 9000, False)
    defaults = cli.parse_args(["up"])
    assert defaults.workers == 1
    assert defaults.log_dir == Path("~/.cache/switchboard/logs")


@pytest.mark.parametrize(
    "argv", [["--verbose", "up"], ["up", "--verbose"], ["-v", "worker"], ["router", "-v"]]
)
def test_verbose_is_accepted_before_and_after_the_command(argv: list[str]) -> None:
    assert cli.parse_args(argv).verbose is True


@pytest.mark.parametrize("workers", ["0", "-1", "two"])
def test_up_refuses_a_worker_count_below_one(workers: str) -> None:
    with pytest.raises(SystemExit):
        cli.parse_args(["up", "--workers", workers])


def test_worker_and_router_take_a_log_file() -> None:
    worker = cli.parse_args(["worker", "--log-file", "w.log", "--model", "a", "--model", "b"])
    assert (worker.log_file, worker.models) == (Path("w.log"), ["a", "b"])
    router = cli.parse_args(["router", "--log-file", "r.log", "--host", "127.0.0.1", "--port", "1"])
    assert (router.log_file, router.host, router.port) == (Path("r.log"), "127.0.0.1", 1)
    assert cli.parse_args(["worker"]).log_file is None


def test_models_takes_a_url() -> None:
    assert cli.parse_args(["models", "--url", "http://h:1"]).url == "http://h:1"
    assert cli.parse_args(["models"]).url is None


def test_worker_with_a_log_file_redirects_and_is_named_by_the_launcher(
    calls: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LOG_LABEL_ENV, "worker-2")
    assert cli.main(["--log-level", "DEBUG", "worker", "--log-file", "w.log"]) == 0
    assert calls["logging"] == {"level": "DEBUG", "component": "worker-2", "log_file": Path("w.log")}
    assert calls["component"][0] == "worker"


def test_verbose_keeps_everything_on_the_terminal(calls: dict[str, Any]) -> None:
    assert cli.main(["--verbose", "router", "--log-file", "r.log"]) == 0
    assert calls["logging"] == {"level": "INFO", "component": "router", "log_file": None}
    assert calls["component"][0] == "router"


def test_models_asks_the_configured_front_door(
    calls: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked: list[tuple[str, str | None, tuple[str, str] | None]] = []
    table = types.ModuleType("switchboard.cli.models")

    def show_models(base_url: str, api_key: str | None, action: tuple[str, str] | None) -> int:
        asked.append((base_url, api_key, action))
        return 3

    table.show_models = show_models  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "switchboard.cli.models", table)
    monkeypatch.delenv(cli.ADMIN_KEY_ENV, raising=False)
    config = tmp_path / "switchboard.toml"
    config.write_text("[router]\nport = 8123\n")
    assert cli.main(["--config", str(config), "models"]) == 3
    assert cli.main(["models", "--url", "http://elsewhere:1", "--key", "sb-admin"]) == 3
    monkeypatch.setenv(cli.ADMIN_KEY_ENV, "sb-from-env")
    assert cli.main(["models"]) == 3
    assert cli.main(["models", "prefetch", "tuned"]) == 3
    assert asked == [
        ("http://127.0.0.1:8123", None, None),
        ("http://elsewhere:1", "sb-admin", None),
        ("http://127.0.0.1:8000", "sb-from-env", None),
        ("http://127.0.0.1:8000", "sb-from-env", ("prefetch", "tuned")),
    ]
    with pytest.raises(SystemExit, match="needs the model's name"):
        cli.main(["models", "unload"])


def test_up_hands_its_flags_to_the_stack(
    calls: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from switchboard.local import stack

    seen: dict[str, Any] = {}

    def run_stack(settings: Any, **options: Any) -> int:
        seen.update(options, port=settings.router.port, host=settings.router.host)
        return 0

    monkeypatch.setattr(stack, "run_stack", run_stack)
    argv = ["up", "--workers", "2", "--log-dir", str(tmp_path), "--port", "8111", "--host", "0.0.0.0", "-v"]
    assert cli.main(argv) == 0
    assert seen == {
        "config_path": None,
        "log_level": "INFO",
        "workers": 2,
        "log_dir": tmp_path,
        "verbose": True,
        "port": 8111,
        "host": "0.0.0.0",
    }
    assert calls["logging"]["log_file"] is None  # `up` itself never redirects


def test_a_bad_config_is_exit_code_2(calls: dict[str, Any], tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[router]\nport = 'not a number'\n")
    assert cli.main(["--config", str(config), "router"]) == 2
    assert "component" not in calls


def test_local_tooling_lives_in_switchboard_local_only() -> None:
    for name in ["stack", "redis_server", "processes", "demo_model"]:
        assert importlib.util.find_spec(f"switchboard.local.{name}") is not None
        assert importlib.util.find_spec(f"switchboard.{name}") is None
