"""Another local user's view of /dev/shm, as fast as one process can look, at the regions whose
name starts with a prefix: each that appears after the look began, and each readable by others at
any moment it is seen.

Run as `python open_regions.py PREFIX`: it prints `polling` once it looks, `new NAME MODE` the first
time it sees each region that was not there at its start, `open NAME MODE` the first time it sees
each region open to others, and `polls N` once its standard input closes. (A region that appears at
all came from Triton's Python backend, which makes it readable by others: on a loaded machine the
look may come too late for the moment it was open, never too late for its being there.)
"""

from __future__ import annotations

import os
import stat
import sys
import threading

SHM_DIR = "/dev/shm"


def main() -> None:
    prefix = sys.argv[1]
    stopping = threading.Event()

    def stop_when_told() -> None:
        sys.stdin.read()
        stopping.set()

    threading.Thread(target=stop_when_told, daemon=True).start()
    seen: set[str] = set()
    with os.scandir(SHM_DIR) as entries:
        there = {entry.name for entry in entries}
    polls = 0
    print("polling", flush=True)
    while not stopping.is_set():
        polls += 1
        with os.scandir(SHM_DIR) as entries:
            for entry in entries:
                if not entry.name.startswith(prefix) or entry.name in seen:
                    continue
                try:
                    mode = stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode)
                except OSError:
                    continue
                if entry.name not in there:
                    there.add(entry.name)
                    print(f"new {entry.name} {mode:o}", flush=True)
                if mode & 0o077:
                    seen.add(entry.name)
                    print(f"open {entry.name} {mode:o}", flush=True)
    print(f"polls {polls}", flush=True)


if __name__ == "__main__":
    main()
