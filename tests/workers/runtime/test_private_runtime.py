"""The worker's runtime folders: its user's alone, gone when it ends, and a dead worker's removed."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from workers.runtime import private_runtime
from workers.runtime.private_runtime import (
    private_process_files,
    remove_abandoned_vllm_sockets,
    remove_stale_runtime_dirs,
    runtime_dir,
)


def dead_pid() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def test_while_the_worker_runs_vllms_sockets_go_to_its_private_folder_and_go_with_it() -> None:
    before = os.environ.get("VLLM_RPC_BASE_PATH")
    with private_process_files() as sockets:
        assert os.environ["VLLM_RPC_BASE_PATH"] == str(sockets)
        assert stat.S_IMODE(sockets.stat().st_mode) == 0o700
        created = sockets / "some-socket"
        created.write_bytes(b"")
        assert stat.S_IMODE(created.stat().st_mode) == 0o600  # the worker's umask
    assert not sockets.exists()
    assert os.environ.get("VLLM_RPC_BASE_PATH") == before


def test_only_this_users_folders_of_processes_that_are_gone_are_removed(tmp_path: Path) -> None:
    gone = tmp_path / f"switchboard-{dead_pid()}-ipc-abc"
    running = tmp_path / f"switchboard-{os.getpid()}-ipc-abc"
    not_ours = tmp_path / f"switchboard-{dead_pid()}-triton-abc"
    unrelated = tmp_path / "switchboard-redis-abc"
    for folder in (gone, running, not_ours, unrelated):
        folder.mkdir()
        (folder / "grpc:1").write_bytes(b"")
    if os.getuid() == 0:
        os.chown(not_ours, 65534, 65534)  # another user's (only root can make one here)
    removed = remove_stale_runtime_dirs(tmp_path)
    assert gone in removed and running.exists() and unrelated.exists()
    if os.getuid() == 0:
        assert removed == [gone] and not_ours.exists()


def test_runtime_folders_are_made_fresh_and_private() -> None:
    first, second = runtime_dir("triton"), runtime_dir("triton")
    try:
        assert first != second
        assert first.parent == Path(tempfile.gettempdir())
        assert first.name.startswith(f"switchboard-{os.getpid()}-triton-")
        assert stat.S_IMODE(first.stat().st_mode) == 0o700
    finally:
        private_runtime.remove_runtime_dir(first)
        private_runtime.remove_runtime_dir(second)


@pytest.mark.parametrize("name", ["switchboard-1-", "switchboard-x-ipc-a", "pytrtion1-a"])
def test_other_names_are_not_runtime_folders(tmp_path: Path, name: str) -> None:
    (tmp_path / name).mkdir()
    assert remove_stale_runtime_dirs(tmp_path) == []


def test_vllm_sockets_nothing_listens_on_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    """What workers left in the temporary folder before vLLM's sockets had a folder of their own."""
    abandoned = tmp_path / str(uuid.uuid4())
    live = tmp_path / str(uuid.uuid4())
    other = tmp_path / "not-a-vllm-socket"
    with socket.socket(socket.AF_UNIX) as gone:
        gone.bind(str(abandoned))  # closed without unlinking, as a killed engine leaves it
    with socket.socket(socket.AF_UNIX) as listening, socket.socket(socket.AF_UNIX) as unnamed:
        listening.bind(str(live))
        listening.listen()
        unnamed.bind(str(other))
        assert remove_abandoned_vllm_sockets(tmp_path) == 1
        assert not abandoned.exists() and live.exists() and other.exists()
