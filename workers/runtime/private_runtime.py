"""The worker's own folders for sockets and runtime files: this user's alone, gone when it ends.

Other users of the machine must not open a socket that takes jobs or read what passes through one
(prompts). Each folder is made by `mkdtemp` (mode 0700, a name nobody can take first) and named
after the process that made it, so that a worker killed without cleaning up leaves nothing for
long: the next worker of the same user removes the folders of processes that are gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from switchboard.private_files import remove_dirs_of_gone_processes

logger = logging.getLogger(__name__)

# switchboard-<pid>-<purpose>-<random>
_PREFIX = "switchboard-"
_NAME = re.compile(r"^switchboard-(\d+)-[a-z]+-")
# What vLLM names its sockets, in the temporary folder unless told otherwise (workers before this one).
_VLLM_SOCKET = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# Nothing a worker or its children create is readable by other users.
PRIVATE_UMASK = 0o077


def runtime_dir(purpose: str) -> Path:
    """A new folder for `purpose` (letters only) that only this user can open."""
    return Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-{purpose}-"))


def remove_runtime_dir(path: Path) -> None:
    """Remove a folder made by `runtime_dir` and everything in it; quiet if it is gone."""
    shutil.rmtree(path, ignore_errors=True)


def remove_stale_runtime_dirs(parent: Path | None = None) -> list[Path]:
    """Remove this user's runtime folders whose process is gone; returns them."""
    parent = Path(tempfile.gettempdir()) if parent is None else parent
    removed = remove_dirs_of_gone_processes(parent, _NAME)
    if removed:
        logger.info("removed the runtime folders of workers that are gone", extra={"count": len(removed)})
    return removed


def remove_abandoned_vllm_sockets(parent: Path | None = None) -> int:
    """Remove this user's vLLM socket files in `parent` that nothing listens on any more; returns how many.

    Workers that put vLLM's sockets in the temporary folder itself left one per engine start.
    """
    parent = Path(tempfile.gettempdir()) if parent is None else parent
    removed = 0
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        for entry in entries:
            if _VLLM_SOCKET.match(entry.name) is None:
                continue
            with contextlib.suppress(OSError):
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISSOCK(info.st_mode) and info.st_uid == os.getuid() and _abandoned(entry.path):
                    os.unlink(entry.path)
                    removed += 1
    return removed


def _abandoned(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.2)  # a busy listener's full backlog would hold a blocking connect
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
    return False


@contextlib.contextmanager
def private_process_files() -> Iterator[Path]:
    """For the worker's process, while it runs: its files private, vLLM's sockets in a folder of its own.

    vLLM makes a socket file per engine in the temporary folder and leaves it there; in a folder
    of the worker's own, removed when the worker ends, they neither pile up nor are reachable.
    Yields that folder.
    """
    previous_umask = os.umask(PRIVATE_UMASK)
    remove_stale_runtime_dirs()
    remove_abandoned_vllm_sockets()
    sockets = runtime_dir("ipc")
    previous = os.environ.get("VLLM_RPC_BASE_PATH")
    os.environ["VLLM_RPC_BASE_PATH"] = str(sockets)
    try:
        yield sockets
    finally:
        remove_runtime_dir(sockets)
        if previous is None:
            os.environ.pop("VLLM_RPC_BASE_PATH", None)
        else:
            os.environ["VLLM_RPC_BASE_PATH"] = previous
        os.umask(previous_umask)
