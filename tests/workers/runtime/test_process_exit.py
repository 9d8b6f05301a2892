"""A stopped worker's process ends at once, and still exports its queued spans and flushes its logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

# A process that holds a queued span and a buffered log line, and a few hundred thousand objects
# for the interpreter's teardown to collect, then ends through `exit_at_once`.
PROGRAM = textwrap.dedent(
    """
    import logging, sys
    from switchboard.tracing import configure_tracing, span
    from workers.runtime.process_exit import exit_at_once

    configure_tracing("exit-check")
    handler = logging.FileHandler(sys.argv[1])
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    kept = [{"n": [n]} for n in range(300_000)]
    with span("the last span"):
        logging.getLogger("exit-check").info("the last line")
    print("the last print", end="")
    exit_at_once(3)
    """
)


def test_exit_at_once_keeps_the_exit_code_the_spans_and_the_logs(tmp_path: Path) -> None:
    log, spans = tmp_path / "worker.log", tmp_path / "spans.jsonl"
    environ = {**os.environ, "SWITCHBOARD_TRACE_FILE": str(spans)}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(log)], env=environ, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "the last print"
    assert "the last line" in log.read_text()
    names = [json.loads(line)["name"] for line in spans.read_text().splitlines()]
    assert names == ["the last span"]
