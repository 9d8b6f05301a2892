"""The worker's runtime folders: its user's alone, gone when it ends, and a dead worker's removed."""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from workers.runtime import private_runtime
from workers.runtime.private_runtime import private_process_files, remove_stale_runtime_dirs, runtime_dir


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
