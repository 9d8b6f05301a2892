"""Folders and files that only this user may open: where secrets and prompts are kept on disk.

Other users of the machine must not read a password, a queued prompt or an append-only file, nor
open a socket that takes jobs. Folders are 0700 and files 0600; a folder that already exists must
belong to this user (another user could have made it first, to read what lands there).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from pathlib import Path
from typing import BinaryIO

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
# For the processes that write such files: nothing they create is readable by others.
PRIVATE_UMASK = 0o077


class NotPrivate(RuntimeError):
    """A folder meant to be private belongs to someone else, or is not a folder."""


def private_dir(path: Path) -> Path:
    """Make `path` (and missing parents) a folder of this user's that only this user can open."""
    path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise NotPrivate(f"{path} is not a folder")
    if info.st_uid != os.getuid():
        raise NotPrivate(f"{path} belongs to another user; it must be this user's own (mode 0700)")
    if stat.S_IMODE(info.st_mode) != PRIVATE_DIR_MODE:
        path.chmod(PRIVATE_DIR_MODE)
    return path


def make_private_tree(path: Path) -> None:
    """Close up what an earlier, less careful run left in `path`: folders 0700, files 0600."""
    for root, folders, files in os.walk(path):
        for name in folders:
            _chmod(Path(root, name), PRIVATE_DIR_MODE)
        for name in files:
            _chmod(Path(root, name), PRIVATE_FILE_MODE)


def write_private(path: Path, text: str) -> Path:
    """Write `text` to a new file `path` that only this user can read (never readable by others, even briefly)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    with os.fdopen(fd, "w") as file:
        file.write(text)
    return path


def append_private(path: Path) -> BinaryIO:
    """Open `path` for appending, made 0600 if it is new; a file an earlier run left readable by
    others is closed before anything is written to it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & ~PRIVATE_FILE_MODE:
            os.fchmod(fd, PRIVATE_FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")


def _chmod(path: Path, mode: int) -> None:
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid():
        return
    if stat.S_IMODE(info.st_mode) != mode:
        path.chmod(mode)


def pid_is_gone(pid: int) -> bool:
    """Whether no process has this id (one of another user's still counts as there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def remove_dirs_of_gone_processes(parent: Path, name: re.Pattern[str]) -> list[Path]:
    """Remove this user's folders in `parent` whose name matches `name`, with the process id as
    its first group, where that process is gone; returns them."""
    removed = []
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        for entry in entries:
            match = name.match(entry.name)
            if match is None or not entry.is_dir(follow_symlinks=False):
                continue
            if entry.stat(follow_symlinks=False).st_uid != os.getuid() or not pid_is_gone(int(match[1])):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed
