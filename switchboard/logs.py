"""Log lines with their structured fields (`extra=`) visible, as text or as JSON."""

from __future__ import annotations

import json
import logging
import os

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


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


def configure_logging(level: str = "INFO", component: str = "") -> None:
    """Log to stderr; SWITCHBOARD_LOG_FORMAT=json switches to JSON lines."""
    handler = logging.StreamHandler()
    if os.environ.get("SWITCHBOARD_LOG_FORMAT", "text") == "json":
        handler.setFormatter(JsonFormatter())
    else:
        prefix = f"[{component}] " if component else ""
        handler.setFormatter(TextFormatter(f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
