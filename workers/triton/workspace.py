"""PyTriton's workspace for this worker's Triton: a copy of the server (about 20 MB), the model
store, and each model stub's sockets.

PyTriton makes one with a random name and removes it when Triton stops; a worker killed outright
leaves it behind, and they piled up. Named after the worker's process instead, and as short as
PyTriton's own names (the stubs' socket paths, which hold the model's name, must fit Linux's
limit), the workspaces of workers that are gone are removed at the next start.

Only this user may open one, from its first moment: PyTriton makes the workspace folder itself, with
the default mode, so it goes inside a folder of the worker's that is made 0700 before anything is in
it (closing PyTriton's folder once made would leave a moment in which it is open).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from pathlib import Path

from pytriton.constants import PYTRITON_HOME

from switchboard.private_files import PRIVATE_DIR_MODE, remove_dirs_of_gone_processes

# sb<pid>-<4 hex>/w: no longer than PyTriton's workspace_<8 random>.
_NAME = re.compile(r"^sb(\d+)-[0-9a-f]{4}$")
# PyTriton's folder inside the private one.
WORKSPACE_NAME = "w"
# Tries at a private folder's name not taken yet (65,536 names per process).
_NAME_ATTEMPTS = 8


def new_workspace_path() -> Path:
    """Where the next Triton's workspace goes (PyTriton makes that folder), inside a new folder of
    this user's alone; `remove_workspace` removes both."""
    home = Path(PYTRITON_HOME)
    home.mkdir(parents=True, exist_ok=True)
    for attempt in range(_NAME_ATTEMPTS):
        private = home / f"sb{os.getpid()}-{secrets.token_hex(2)}"
        try:
            private.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            if attempt == _NAME_ATTEMPTS - 1:
                raise
            continue
        return private / WORKSPACE_NAME
    raise AssertionError("unreachable")


def remove_workspace(workspace: Path) -> None:
    """Remove a workspace from `new_workspace_path` and its private folder; quiet if they are gone."""
    shutil.rmtree(workspace.parent, ignore_errors=True)


def remove_stale_workspaces() -> list[Path]:
    """Remove this user's workspaces of processes that are gone; returns them."""
    return remove_dirs_of_gone_processes(Path(PYTRITON_HOME), _NAME)
