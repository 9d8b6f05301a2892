"""The shared memory through which Triton hands each job (the prompt) to a model's Python stub.

Where the worker's own backend is built (`native_backend`), no model has a Python stub and no region
exists. Where it is not, Triton's Python backend makes one region per stub in /dev/shm, named after
PyTriton's prefix for this Triton (`pytrtion<pid>-<hex>`), and makes it readable by every local user
(mode 0644, set explicitly, so the umask does not help; and a POSIX shared memory name has no folder
that the worker could close). A process that opens a region in the milliseconds before this host
closes it keeps reading every later batch of the model: that path is the fallback, and the worker
warns at its start when it takes it.

This host closes each region to other users as soon as it appears, removes this Triton's regions
when it stops, and at start removes those left by this user's processes that are gone (a worker
killed outright leaves its regions behind).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

from switchboard.private_files import pid_is_gone

SHM_DIR = Path("/dev/shm")
# PyTriton's own spelling.
_REGION = re.compile(r"^pytrtion(\d+)-")
# How often new regions are looked for while a model loads (its stub makes one): the longest one
# stays readable by others. Between loads, a stub that Triton restarted makes one too.
WATCH_EVERY_S = 0.005
IDLE_WATCH_EVERY_S = 0.5


class ShmRegions:
    """The regions of one Triton, known by PyTriton's prefix for it, closed as they appear."""

    def __init__(self, prefix: str, directory: Path = SHM_DIR) -> None:
        self.prefix = prefix
        self._directory = directory
        self._loading = 0
        self._wake = threading.Event()
        self._stopping = False
        self._watcher: threading.Thread | None = None

    def paths(self) -> list[Path]:
        """This Triton's regions now."""
        with contextlib.suppress(OSError), os.scandir(self._directory) as entries:
            return [Path(entry.path) for entry in entries if entry.name.startswith(self.prefix)]
        return []

    def make_private(self) -> None:
        """Close every region of this Triton to other users (mode 0600)."""
        for path in self.paths():
            with contextlib.suppress(OSError):
                if stat.S_IMODE(path.stat().st_mode) & 0o077:
                    path.chmod(0o600)

    def watch(self) -> None:
        """Close new regions from now on, until `remove`."""
        self._watcher = threading.Thread(target=self._watch, name="shm-private", daemon=True)
        self._watcher.start()

    @contextlib.contextmanager
    def kept_private(self) -> Iterator[None]:
        """While a model loads, look for its region often, and close what is there at the end."""
        self._loading += 1
        self._wake.set()
        try:
            yield
        finally:
            self._loading -= 1
            self.make_private()

    def remove(self) -> None:
        """Stop watching and remove this Triton's regions (after it stopped)."""
        self._stopping = True
        self._wake.set()
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None
        for path in self.paths():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _watch(self) -> None:
        while not self._stopping:
            self._wake.wait(WATCH_EVERY_S if self._loading else IDLE_WATCH_EVERY_S)
            self._wake.clear()
            self.make_private()


def remove_stale_regions(directory: Path = SHM_DIR) -> list[Path]:
    """Remove this user's regions of Tritons whose process is gone; returns them."""
    removed = []
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            match = _REGION.match(entry.name)
            if match is None or not pid_is_gone(int(match[1])):
                continue
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid == os.getuid():
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed
