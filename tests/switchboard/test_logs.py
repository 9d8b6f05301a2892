"""Log output: records with their fields, and the log-file mode that keeps the terminal short.

The redirect rewires file descriptors 1 and 2, so it runs in a child process, never in pytest's own.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from switchboard.logs import TERMINAL_INFO_LOGGERS, TerminalFilter, TextFormatter

CHILD = textwrap.dedent(
    """
    import logging, os, subprocess, sys
    from pathlib import Path
    from switchboard.logs import configure_logging

    configure_logging("INFO", "worker-2", log_file=Path(sys.argv[1]))
    print("python print to stdout")
    os.write(1, b"raw write to fd 1\\n")
    os.write(2, b"raw write to fd 2\\n")
    subprocess.run(
        [sys.executable, "-c", "import os, sys; print('child stdout'); os.write(2, b'child fd 2\\\\n')"],
        check=True,
    )
    logging.getLogger("workers.controller").info("loading model", extra={"model": "demo"})
    logging.getLogger("switchboard.local.stack").info("whitelisted by prefix")
    logging.getLogger("workers.jobs.consume").info("routine info")
    logging.getLogger("workersmain").info("similar name, other logger")
    logging.getLogger("vllm.engine").info("third-party info")
    logging.getLogger("vllm.engine").warning("third-party warning")
    logging.getLogger("workers.jobs.consume").warning("a warning", extra={"job": "j1"})
    try:
        1 / 0
    except ZeroDivisionError:
        logging.getLogger("switchboard.cli.main").exception("the worker stopped on an error")
    """
)


def _run_child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, check=True
    )


def test_log_file_mode_sends_everything_to_the_file_and_a_summary_to_the_terminal(tmp_path: Path) -> None:
    log_file = tmp_path / "logs" / "worker-2.log"
    done = _run_child(CHILD, str(log_file))
    in_file = log_file.read_text()
    terminal = done.stderr

    # Everything, from Python, from raw fds and from a child process, is in the file.
    for line in [
        "python print to stdout",
        "raw write to fd 1",
        "raw write to fd 2",
        "child stdout",
        "child fd 2",
        "loading model model=demo",
        "routine info",
        "third-party info",
        "third-party warning",
        "a warning job=j1",
        "Traceback (most recent call last)",
    ]:
        assert line in in_file
    assert "[worker-2] INFO workers.controller: loading model" in in_file

    # The terminal (the stderr we had before) shows warnings, errors and whitelisted INFO only.
    assert done.stdout == ""
    assert "[worker-2] loading model" in terminal
    assert "whitelisted by prefix" in terminal
    assert "WARNING workers.jobs.consume: a warning" in terminal
    assert "job=j1" not in terminal, "fields stay in the file"
    assert "ERROR switchboard.cli.main: the worker stopped on an error" in terminal
    assert f"ZeroDivisionError: division by zero (traceback in {log_file})" in terminal
    hidden_lines = ["routine info", "similar name", "third-party", "raw write", "child", "Traceback"]
    for hidden in hidden_lines:
        assert hidden not in terminal


def test_without_a_log_file_everything_stays_on_stderr() -> None:
    code = textwrap.dedent(
        """
        import logging
        from switchboard.logs import configure_logging
        assert configure_logging("INFO", "router") is None
        logging.getLogger("workers.jobs.consume").info("routine info")
        """
    )
    done = _run_child(code)
    assert "[router] INFO workers.jobs.consume: routine info" in done.stderr


def test_appending_keeps_what_the_file_held(tmp_path: Path) -> None:
    log_file = tmp_path / "router.log"
    log_file.write_text("earlier line\n")
    code = "import sys; from pathlib import Path; from switchboard.logs import configure_logging\n"
    code += "configure_logging('INFO', log_file=Path(sys.argv[1])); print('later line')"
    _run_child(code, str(log_file))
    assert log_file.read_text().splitlines() == ["earlier line", "later line"]


def _record(name: str, level: int) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, "message", None, None)


def test_terminal_filter_passes_warnings_and_the_named_loggers_info() -> None:
    terminal = TerminalFilter()
    assert "workers.controller" in TERMINAL_INFO_LOGGERS
    assert terminal.filter(_record("workers.controller", logging.INFO))
    assert terminal.filter(_record("workers.controller.loop", logging.INFO))
    assert terminal.filter(_record("workers.jobs.consume", logging.WARNING))
    assert terminal.filter(_record("router", logging.WARNING))
    assert not terminal.filter(_record("vllm.triton_utils", logging.WARNING))
    assert terminal.filter(_record("vllm.engine", logging.ERROR))
    assert terminal.filter(_record("anything.else", logging.CRITICAL))
    assert not terminal.filter(_record("workers.controllers", logging.INFO))
    assert not terminal.filter(_record("workers.jobs.consume", logging.INFO))
    assert not terminal.filter(_record("workers.controller", logging.DEBUG))
    assert TerminalFilter(["router"]).filter(_record("router.app", logging.INFO))


def test_text_formatter_shows_extra_fields() -> None:
    record = logging.makeLogRecord({"name": "x", "levelname": "INFO", "msg": "hello", "model": "m"})
    assert TextFormatter("%(message)s").format(record) == "hello model=m"


def test_fields_a_record_factory_adds_to_every_record_are_not_extras() -> None:
    original = logging.getLogRecordFactory()

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = original(*args, **kwargs)
        record.library_process_name = "MainProcess"  # as vLLM's factory does
        return record

    logging.setLogRecordFactory(factory)
    try:
        logger = logging.getLogger("tests.switchboard.test_logs")
        record = logger.makeRecord(
            logger.name, logging.INFO, __file__, 1, "hello", (), None, extra={"model": "m"}
        )
        assert TextFormatter("%(message)s").format(record) == "hello model=m"
    finally:
        logging.setLogRecordFactory(original)


def test_log_lines_of_a_request_carry_its_ids_in_text_and_json() -> None:
    code = textwrap.dedent(
        """
        import json, logging, os, sys
        from types import SimpleNamespace
        from switchboard import tracing
        from switchboard.logs import configure_logging
        configure_logging("INFO", "router")
        ids = SimpleNamespace(request_id="0123abcd", client_request_id="theirs")
        token = tracing.bind_request(ids)
        logging.getLogger("router.x").info("inside")
        ids.request_id = "job-id"  # the request's job took over its id
        logging.getLogger("router.x").info("later", extra={"request_id": "named"})
        tracing.unbind_request(token)
        logging.getLogger("router.x").info("outside")
        """
    )
    for log_format in ("text", "json"):
        env = {**os.environ, "SWITCHBOARD_LOG_FORMAT": log_format}
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True, env=env
        )
        lines = done.stderr.splitlines()
        if log_format == "text":
            assert lines[0].endswith("inside request_id=0123abcd client_request_id=theirs"), lines
            assert lines[1].endswith("later request_id=named"), "a record's own field wins"
            assert lines[2].endswith("outside"), lines
        else:
            records = [json.loads(line) for line in lines]
            assert (records[0]["request_id"], records[0]["client_request_id"]) == ("0123abcd", "theirs")
            assert "request_id" not in records[2]
