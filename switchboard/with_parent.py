"""Run a program that ends when its parent does: `python -m switchboard.with_parent PID PROGRAM ARGS...`.

`switchboard up` (and the test stacks) start Redis, workers and the front door as children. Killed
with SIGKILL, or losing its terminal without passing the signal on, a parent cannot stop them
itself, and they would serve on without it. So each child is started through this small wrapper:
it asks Linux to send it SIGTERM when its parent dies (`PR_SET_PDEATHSIG`, which survives the exec
that follows), checks that the parent is still the one it was started by (it may have died before
the request took effect), and becomes the program. On SIGTERM a worker drains and stops its engines
and Triton, and Redis and the front door shut down as on any stop.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def wrap(argv: list[str]) -> list[str]:
    """`argv` started so that it gets SIGTERM when this process dies."""
    return [sys.executable, "-m", __name__, str(os.getpid()), *argv]


def ask_for_signal_when_parent_dies(sig: signal.Signals) -> None:
    """Linux sends this process `sig` when its parent dies (nothing elsewhere)."""
    if not sys.platform.startswith("linux"):
        return  # elsewhere the parent's own stop is all there is
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def main(args: list[str]) -> None:
    parent, program = int(args[0]), args[1:]
    ask_for_signal_when_parent_dies(signal.SIGTERM)
    if os.getppid() != parent:
        sys.exit(f"switchboard: not starting {program[0]}: the process that started it has already ended")
    os.execvp(program[0], program)


if __name__ == "__main__":
    main(sys.argv[1:])
