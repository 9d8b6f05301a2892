"""Log lines with their structured fields (`extra=`) visible, as text or as JSON.

Two ways to run a component:

- on the terminal (`configure_logging(level)`, or `--verbose`): every record, and everything Triton,
  vLLM and their child processes print, goes to stderr as it always did;
- into a log file (`configure_logging(level, log_file=PATH)`): file descriptors 1 and 2 are pointed at
  the file, so whatever third-party code, C++ code and child processes write lands there, and log
  records go to the file and, filtered, to the terminal we had before: our warnings, every error,
  and the INFO records of the few loggers that tell a person what is happening (a model loading, a
  worker ready). Hundreds of start-up lines stay in the file.
"""

from __future__ import annotations

import io
import json
import logging
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from switchboard.tracing import request_ids, trace_ids

# Attributes every LogRecord has; anything else on a record came from `extra=`, or from a record
# factory that a library installed (vLLM adds `vllm_process_name` to every record): see _fields.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}
# The record factory last seen, and the attributes it puts on every record.
_factory_fields: tuple[object, frozenset[str]] = (None, _STANDARD)

# Names the component in its log lines ("worker-2"); set by the launcher, which starts several.
LOG_LABEL_ENV = "SWITCHBOARD_LOG_LABEL"

# Loggers whose INFO records reach the terminal when the rest goes to a log file.
TERMINAL_INFO_LOGGERS = ("workers.main", "workers.controller", "switchboard.local")
# Switchboard's own loggers, whose warnings reach the terminal (other libraries' need to be errors).
OWN_LOGGERS = ("switchboard", "router", "workers")


def _fields(record: logging.LogRecord) -> dict[str, object]:
    """The record's `extra=` fields: what neither LogRecord nor the current record factory puts on every record."""
    global _factory_fields
    factory = logging.getLogRecordFactory()
    if _factory_fields[0] is not factory:
        blank = factory("", logging.INFO, "", 0, "", None, None)
        _factory_fields = (factory, _STANDARD | frozenset(vars(blank)))
    standard = _factory_fields[1]
    return {k: v for k, v in vars(record).items() if k not in standard}


class TextFormatter(logging.Formatter):
    """`time level logger message key=value ...`"""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        return f"{line} {fields}" if fields else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for shipping to a log store."""

    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


class TerminalFormatter(logging.Formatter):
    """`12:00:01 [worker] message`: short lines for a person; fields and tracebacks stay in the file.

    The messages meant for the terminal say what happened in words; their structured fields
    (`extra=`) are for machines reading the log file.
    """

    def __init__(self, component: str, log_file: Path) -> None:
        super().__init__(datefmt="%H:%M:%S")
        self._prefix = f"[{component}] " if component else ""
        self._log_file = log_file

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno == logging.INFO else f"{record.levelname} {record.name}: "
        line = f"{self.formatTime(record, self.datefmt)} {self._prefix}{level}{record.getMessage()}"
        # Not super().format: it would cache the full traceback on the record for the file's handler.
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            line += f"\n    {type(error).__name__}: {error} (traceback in {self._log_file})"
        return line


class TerminalFilter(logging.Filter):
    """What a person sees: our warnings and errors, INFO of the loggers in `info_prefixes`, others' errors.

    Libraries' warnings (vLLM's "Triton is installed, but doesn't include CPU backend", PyTriton's
    on a machine without a GPU) stay in the file: a person can do nothing about them.
    """

    def __init__(
        self, info_prefixes: Iterable[str] = TERMINAL_INFO_LOGGERS, own_prefixes: Iterable[str] = OWN_LOGGERS
    ) -> None:
        super().__init__()
        self._info = tuple(info_prefixes)
        self._own = tuple(own_prefixes)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        if record.levelno >= logging.WARNING:
            return _under(record.name, self._own)
        return record.levelno == logging.INFO and _under(record.name, self._info)


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    """Whether logger `name` is one of `prefixes` or a child of one."""
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def configure_logging(
    level: str = "INFO",
    component: str = "",
    *,
    log_file: Path | None = None,
    terminal_info_loggers: Iterable[str] = TERMINAL_INFO_LOGGERS,
) -> TextIO | None:
    """Log to stderr, or with `log_file` to that file (fds 1 and 2 included) and a few lines to the terminal.

    SWITCHBOARD_LOG_FORMAT=json writes JSON lines (to stderr, or to the file; the terminal stays text).
    Returns the terminal stream that the redirect saved, or None when nothing was redirected.
    """
    if log_file is None:
        handler = logging.StreamHandler()
        handler.setFormatter(_file_formatter(component))
        handler.addFilter(trace_ids)
        handler.addFilter(request_ids)
        logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
        return None
    terminal = redirect_output(log_file)
    # After the redirect sys.stderr writes to the file, in order with what everything else writes there.
    to_file = logging.StreamHandler(sys.stderr)
    to_file.setFormatter(_file_formatter(component))
    to_file.addFilter(trace_ids)
    to_file.addFilter(request_ids)
    to_terminal = logging.StreamHandler(terminal)
    to_terminal.setFormatter(TerminalFormatter(component, log_file))
    to_terminal.addFilter(TerminalFilter(terminal_info_loggers))
    logging.basicConfig(level=level.upper(), handlers=[to_file, to_terminal], force=True)
    return terminal


def redirect_output(log_file: Path) -> TextIO:
    """Point fds 1 and 2 at `log_file` (appending); returns a stream on the stderr we had before.

    At the file-descriptor level, so that C++ code (Triton) and every child process started later
    (the engine's) write to the file too, not only Python's `print`.
    """
    log_file = Path(log_file).expanduser()
    log_file.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    terminal = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    # Line by line, so Python's output and the C++ code's interleave in the order they happened.
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True)
    return terminal


def _file_formatter(component: str) -> logging.Formatter:
    if os.environ.get("SWITCHBOARD_LOG_FORMAT", "text") == "json":
        return JsonFormatter()
    prefix = f"[{component}] " if component else ""
    return TextFormatter(f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s")
