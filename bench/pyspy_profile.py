"""Sampling profiles of running processes with py-spy, and the frames that spend the most themselves.

py-spy records in its raw format (collapsed stacks, one `frame;frame;...;frame count` per line), which
speedscope opens as it is and Brendan Gregg's flamegraph.pl turns into an SVG. It samples without
stopping the process (`--nonblocking`), so the target's own CPU time is unchanged (py-spy's own is
counted apart), and with `--threads`, so each stack starts at its thread's id. Only threads running
Python code or in native code called from it show; idle threads are left out by py-spy.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

STOP_TIMEOUT_S = 30.0
MISSING = (
    "py-spy was not found (next to this Python or on PATH), so no profiles are recorded and Python "
    'threads go by their kernel name (all "python"); the CPU accounting goes on. py-spy is in the '
    "project's bench dependency group: `make install-bench` (or `uv pip install py-spy`), then "
    "run again."
)
THREAD_FRAME = re.compile(r"^(?:thread|process) \(?(0x[0-9a-fA-F]+|\d+)\)?")
LINE_NUMBER = re.compile(r":\d+\)$")


@dataclass(frozen=True)
class Frame:
    """A function and how many samples found it at the top of the stack."""

    frame: str
    samples: int
    share: float  # of all the profile's samples


def py_spy_path() -> str | None:
    """py-spy beside this interpreter (a venv's bin/), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Recording:
    """One py-spy process recording one target until `stop`."""

    def __init__(
        self, executable: str, pid: int, output: Path, rate: int, native: bool, gil: bool = False
    ) -> None:
        """`gil`: sample only the thread holding the GIL, so that a thread waiting for it (in a
        process whose threads all run Python) does not count as busy."""
        self.output = output
        self.log = output.with_suffix(".log")
        argv = [executable, "record", "--pid", str(pid), "--format", "raw", "--output", str(output)]
        argv += ["--rate", str(rate), "--threads"]
        # Native stacks need the target stopped at each sample; without them it runs undisturbed.
        argv += ["--native"] if native else ["--nonblocking"]
        argv += ["--gil"] if gil else []
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def stop(self) -> str | None:
        """Ask py-spy to write its profile (SIGINT, as Ctrl-C); None if it did, else why not."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return f"py-spy did not stop within {STOP_TIMEOUT_S:g} s; see {self.log}"
        if not self.output.exists() or self.output.stat().st_size == 0:
            tail = self.log.read_text().strip().splitlines()[-1:] or ["no output"]
            return f"no profile written ({tail[0][:200]}); see {self.log}"
        return None


def python_thread_names(executable: str, pid: int) -> dict[int, str]:
    """Thread id: Python thread name, of a Python process (`py-spy dump --json`); empty if it fails."""
    try:
        dump = subprocess.run(
            [executable, "dump", "--json", "--nonblocking", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=STOP_TIMEOUT_S,
            check=True,
        )
        return parse_thread_names(dump.stdout)
    except (subprocess.SubprocessError, ValueError):
        return {}


def parse_thread_names(text: str) -> dict[int, str]:
    """Thread id: name from `py-spy dump --json`'s list of threads (those without an OS id left out)."""
    return {
        int(thread["os_thread_id"]): str(thread["thread_name"])
        for thread in json.loads(text)
        if thread.get("os_thread_id") and thread.get("thread_name")
    }


def parse_collapsed(text: str) -> list[tuple[list[str], int]]:
    """(frames, samples) per line of collapsed stacks, root first; the count is after the last space."""
    stacks = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def without_line(frame: str) -> str:
    """`handle (router/app.py:42)` as `handle (router/app.py)`: self time adds up per function."""
    return LINE_NUMBER.sub(")", frame)


def top_self_frames(text: str, count: int = 10, thread_ids: set[int] | None = None) -> list[Frame]:
    """The functions that were on top of the stack (running themselves) in the most samples, of all
    threads or of those in `thread_ids`; shares are of those threads' samples."""
    selfs: dict[str, int] = {}
    total = 0
    for frames, samples in parse_collapsed(text):
        if thread_ids is not None and thread_id(frames) not in thread_ids:
            continue
        frames = [frame for frame in frames if not THREAD_FRAME.match(frame)]
        top = without_line(frames[-1]) if frames else "(thread only)"
        selfs[top] = selfs.get(top, 0) + samples
        total += samples
    ranked = sorted(selfs.items(), key=lambda item: -item[1])[:count]
    return [Frame(frame, samples, round(samples / total, 4)) for frame, samples in ranked]


def thread_id(frames: list[str]) -> int | None:
    """The thread id of the `thread (id)` frame `--threads` puts at a stack's root, if there is one."""
    match = THREAD_FRAME.match(frames[0]) if frames else None
    return int(match.group(1), 0) if match else None


def samples_by_thread(text: str) -> dict[int, int]:
    """Samples per thread id (stacks without a thread frame left out)."""
    counts: dict[int, int] = {}
    for frames, samples in parse_collapsed(text):
        if (tid := thread_id(frames)) is not None:
            counts[tid] = counts.get(tid, 0) + samples
    return counts
