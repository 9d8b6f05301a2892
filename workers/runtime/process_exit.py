"""End a worker process at once once it has stopped everything it started.

By the time `run_worker` returns, the worker has drained its jobs, stopped its engines, Triton and
its descendants' guard, and closed its Redis connections. What the interpreter would still do is
tear itself down: collect every object the engine runtime created (torch, vLLM, PyTriton), module
by module. Measured on the demo model: 6 s between the worker's last log line and its exit, in the
interpreter's final garbage collection, on every stop (a rolling restart, `switchboard up`'s Ctrl-C,
every test stack). So the process ends here instead, after the two things that teardown did for
us: the spans still queued are exported, and every log handler is flushed and closed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn

from switchboard.tracing import shutdown_tracing


def exit_at_once(code: int) -> NoReturn:
    """Export queued spans, close the logs, and end the process with `code`, skipping teardown."""
    shutdown_tracing()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        # A closed or broken stream has nothing more to say.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
