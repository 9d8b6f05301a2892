"""PyTriton's workspace for this worker's Triton: a copy of the server (about 20 MB), the model
store, and each model stub's sockets.

PyTriton makes one with a random name and removes it when Triton stops; a worker killed outright
leaves it behind, and they piled up. Named after the worker's process instead, and as short as
PyTriton's own names (the stubs' socket paths, which hold the model's name, must fit Linux's
limit), the workspaces of workers that are gone are removed at the next start. Only this user may
open one, as PyTriton's own are.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from pytriton.constants import PYTRITON_HOME

from switchboard.local.private_files import PRIVATE_DIR_MODE, remove_dirs_of_gone_processes

# sb<pid>-<4 hex>: no longer than PyTriton's workspace_<8 random>.
_NAME = re.compile(r"^sb(\d+)-[0-9a-f]{4}$")


def new_workspace_path() -> Path:
    """Where the next Triton's workspace goes (PyTriton makes the folder; see `make_private`)."""
    return Path(PYTRITON_HOME) / f"sb{os.getpid()}-{secrets.token_hex(2)}"


def make_private(path: Path) -> None:
    """Close the workspace to other users, before anything but an empty model store is in it."""
    path.chmod(PRIVATE_DIR_MODE)


def remove_stale_workspaces() -> list[Path]:
    """Remove this user's workspaces of processes that are gone; returns them."""
    return remove_dirs_of_gone_processes(Path(PYTRITON_HOME), _NAME)
