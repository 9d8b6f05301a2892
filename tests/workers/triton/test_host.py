"""The worker's Triton is the worker's alone: no port but metrics (on loopback), no token on its
command line, and its shared memory, socket and workspace closed to other users and gone when it
stops (or, when it was killed, at the next start)."""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import psutil
import pytest
from pytriton.constants import PYTRITON_HOME
from pytriton.triton import TritonConfig

from switchboard.config import triton_model_name
from switchboard.wire import chunk_decoder, encode
from tests.support.jobs import make_job
from tests.support.network import connection_refused, non_loopback_ipv4
from tests.support.scripted_engine import ScriptedEngine
from workers.triton import host, model_configs
from workers.triton.generator.client import TritonJobClient
from workers.triton.generator.model import CoalescingPolicy
from workers.triton.host import TritonHost
from workers.triton.shm_regions import SHM_DIR


@pytest.fixture(scope="module")
def triton() -> Iterator[TritonHost]:
    host = TritonHost(coalescing=CoalescingPolicy(min_window_s=0.01, max_window_s=0.01, max_chunks_per_s=100))
    host.start()
    try:
        yield host
    finally:
        host.stop()


def test_triton_listens_on_no_tcp_port_but_its_metrics_one_on_loopback(triton: TritonHost) -> None:
    """Its gRPC and HTTP APIs are on no port any local user (or the network) could reach."""
    server = _triton_server(triton)
    listening = {(c.laddr.ip, c.laddr.port) for c in server.net_connections("inet") if c.status == "LISTEN"}
    assert listening == {("127.0.0.1", triton.metrics_port)}
    address = non_loopback_ipv4()
    assert connection_refused(address, triton.metrics_port), (
        f"Triton's metrics port is reachable on {address}"
    )


def test_tritons_command_line_holds_no_token(triton: TritonHost) -> None:
    """Every local user can read /proc/PID/cmdline: no secret may be there (nor is one needed)."""
    command_line = Path(f"/proc/{_triton_server(triton).pid}/cmdline").read_bytes().decode()
    assert "restricted" not in command_line and "access-token" not in command_line, command_line
    assert triton._control_headers() is None


def test_shared_memory_and_the_socket_are_this_users_alone_and_go_with_the_host(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # a worker that was killed outright, say
    stale_region = SHM_DIR / f"pytrtion{gone.pid}-0badc0de-left-behind"
    stale_folder = Path(tempfile.gettempdir()) / f"switchboard-{gone.pid}-triton-leftover"
    live_region = SHM_DIR / f"pytrtion{os.getpid()}-0badc0de-still-in-use"
    for region in (stale_region, live_region):
        region.write_bytes(b"a prompt")
    stale_folder.mkdir(mode=0o700)
    (stale_folder / "grpc:1").write_bytes(b"")
    stale_workspace = Path(PYTRITON_HOME) / f"sb{gone.pid}-abcd"
    stale_workspace.mkdir(mode=0o700, parents=True)
    (stale_workspace / "m_0_0-server.sock").write_bytes(b"")
    # A Python-backend stub's shared memory (the worker's own backend has none; pooling models have).
    host = TritonHost(
        coalescing=CoalescingPolicy(min_window_s=0.01, max_window_s=0.01, max_chunks_per_s=100),
        native=False,
    )
    try:
        host.start()
        assert not stale_region.exists() and not stale_folder.exists() and not stale_workspace.exists()
        workspace = host._running()._workspace.path
        # PyTriton makes its workspace with the default mode: inside a folder that was 0700 first.
        assert stat.S_IMODE(workspace.parent.stat().st_mode) == 0o700
        assert workspace.parent.parent == Path(PYTRITON_HOME)
        assert live_region.exists(), "a running process's region is left alone"
        host.bind("m", ScriptedEngine())
        assert host._shm is not None
        regions = host._shm.paths()
        assert regions, "the model's stub has a region"
        for region in regions:
            assert stat.S_IMODE(region.stat().st_mode) == 0o600, region
        socket_path = Path(host.grpc_address.removeprefix("unix:"))
        assert stat.S_ISSOCK(socket_path.stat().st_mode)
        assert stat.S_IMODE(socket_path.parent.stat().st_mode) == 0o700
    finally:
        host.stop()
        live_region.unlink()
    assert not any(region.exists() for region in regions)
    assert not socket_path.parent.exists()
    assert not workspace.parent.exists()


def test_a_stop_while_triton_starts_leaves_no_triton_running() -> None:
    """A worker stopped early (its start runs in a thread it cannot interrupt) must not find Triton
    started after its stop: the stop waits for the start and stops what it started."""
    host = TritonHost(coalescing=CoalescingPolicy(min_window_s=0.01, max_window_s=0.01, max_chunks_per_s=100))
    starting = threading.Thread(target=host.start)
    starting.start()
    time.sleep(0.05)  # well inside the second or more that a start takes
    host.stop()
    starting.join(60)
    assert not starting.is_alive()
    assert host._triton is None
    assert not [
        process
        for process in psutil.Process().children(recursive=True)
        if process.name() == "tritonserver"
        and f"--metrics-port {host.metrics_port}" in " ".join(process.cmdline())
    ]
    host.start()  # once stopped, a late start starts nothing
    assert host._triton is None


def _triton_server(triton: TritonHost) -> psutil.Process:
    """This host's tritonserver process (tests may have started others)."""
    (server,) = [
        process
        for process in psutil.Process().children(recursive=True)
        if process.name() == "tritonserver"
        and f"--metrics-port {triton.metrics_port}" in " ".join(process.cmdline())
    ]
    return server


def test_the_triton_server_dies_with_a_killed_worker() -> None:
    import subprocess
    import sys
    import time

    import psutil

    script = (
        "from workers.triton.host import TritonHost\n"
        "from workers.triton.generator.model import CoalescingPolicy\n"
        "import time\n"
        "TritonHost(coalescing=CoalescingPolicy(min_window_s=0.01, max_window_s=0.01, max_chunks_per_s=100)).start()\n"
        "print('<triton is up>', flush=True)\n"
        "time.sleep(600)\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        # Triton prints on the same pipe, a line in several writes, and may still be at it (its
        # metrics line comes after gRPC is up): the marker can land in the middle of one of its lines.
        line = worker.stdout.readline()
        while line and "<triton is up>" not in line:
            line = worker.stdout.readline()
        assert "<triton is up>" in line, "the worker started Triton"
        (server,) = [
            p for p in psutil.Process(worker.pid).children(recursive=True) if p.name() == "tritonserver"
        ]
        worker.kill()  # SIGKILL: the worker cleans nothing up
        worker.wait()
        deadline = time.monotonic() + 20
        while server.is_running() and server.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "Triton outlived its worker"
            time.sleep(0.2)
    finally:
        worker.kill()


def test_a_failed_bind_leaves_nothing_that_fails_the_next_one(
    triton: TritonHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model Triton refuses to load leaves neither its folder in the repository nor its engine's
    loop and socket behind: the next bind of the same name loads, and its jobs are served."""
    real_config = model_configs._generator_config
    monkeypatch.setattr(
        model_configs,
        "_generator_config",
        lambda *args: real_config(*args).replace("TYPE_STRING", "TYPE_NONE"),
    )
    threads = {t.name for t in threading.enumerate()}
    with pytest.raises(Exception, match="failed to load"):
        triton.bind("again", ScriptedEngine())
    assert not (triton._running()._workspace.model_store_path / "again").exists()
    assert {t.name for t in threading.enumerate()} == threads, "no engine loop left running"
    assert not list(triton._socket_folder().glob("jobs-*")), "no socket left listening"
    monkeypatch.setattr(model_configs, "_generator_config", real_config)
    model = triton.bind("again", ScriptedEngine())
    try:
        chunks = asyncio.run(_one_job(triton, "again"))
        assert "".join(chunk_decoder.decode(c).text for c in chunks) == "t0\x00 t1\x00 "
    finally:
        asyncio.run(model.stop_engine())
        triton.unbind("again")


async def _one_job(triton: TritonHost, model: str) -> list[bytes]:
    """A job's chunks as a Triton client outside the worker gets them: as its request's responses."""
    client = TritonJobClient(triton.grpc_address, triton_model_name(model))
    try:
        return [chunk async for chunk in client.stream(encode(make_job(model, "fast 2")))]
    finally:
        await client.close()


class _BusyOnce:
    """Stands in for PyTriton's Triton: the first server's binary is "busy", as after a fork."""

    made: ClassVar[list[_BusyOnce]] = []

    def __init__(self, config: object, *, workspace: Path, **_: object) -> None:
        self.stopped = False
        self.workspace = workspace
        workspace.mkdir(parents=True)
        _BusyOnce.made.append(self)

    def run(self) -> None:
        if len(_BusyOnce.made) == 1:
            raise OSError(errno.ETXTBSY, "Text file busy")

    def stop(self) -> None:
        self.stopped = True
        self.workspace.rmdir()
        assert self.workspace.parent.exists(), "the private folder goes after the workspace"


def test_a_busy_triton_binary_is_started_again_and_the_failed_try_cleaned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(host, "Triton", _BusyOnce)
    _BusyOnce.made = []
    started = host._run_triton(TritonConfig())
    assert started is _BusyOnce.made[1]
    assert _BusyOnce.made[0].stopped and not _BusyOnce.made[1].stopped
    assert not _BusyOnce.made[0].workspace.parent.exists()
    assert stat.S_IMODE(started.workspace.parent.stat().st_mode) == 0o700
    started.stop()
    started.workspace.parent.rmdir()


def test_other_errors_starting_triton_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: object) -> None:
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(host, "Triton", _BusyOnce)
    monkeypatch.setattr(_BusyOnce, "run", refuse)
    _BusyOnce.made = []
    with pytest.raises(OSError, match="Permission denied"):
        host._run_triton(TritonConfig())
    assert len(_BusyOnce.made) == 1
    assert _BusyOnce.made[0].stopped and not _BusyOnce.made[0].workspace.parent.exists()
