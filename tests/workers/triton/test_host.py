"""The worker's Triton listens on loopback only: nothing else on the network reaches its ports."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import ClassVar

import pytest
from pytriton.triton import TritonConfig

from tests.support.network import accepts, connection_refused, non_loopback_ipv4
from tests.support.scripted_engine import ScriptedEngine
from workers.triton import host
from workers.triton.host import TritonHost
from workers.triton.model import CoalescingPolicy


@pytest.fixture(scope="module")
def triton() -> Iterator[TritonHost]:
    host = TritonHost(coalescing=CoalescingPolicy(min_window_s=0.01, max_window_s=0.01, max_chunks_per_s=100))
    host.start()
    try:
        yield host
    finally:
        host.stop()


def test_http_grpc_and_metrics_ports_refuse_connections_on_other_addresses(triton: TritonHost) -> None:
    address = non_loopback_ipv4()
    ports = {"http": triton.http_port, "grpc": triton.grpc_port, "metrics": triton.metrics_port}
    for name, port in ports.items():
        assert accepts("127.0.0.1", port), f"Triton's {name} port {port} does not answer on loopback"
        assert connection_refused(address, port), f"Triton's {name} port {port} is reachable on {address}"


def test_the_triton_server_dies_with_a_killed_worker() -> None:
    import subprocess
    import sys
    import time

    import psutil

    script = (
        "from workers.triton.host import TritonHost\n"
        "from workers.triton.model import CoalescingPolicy\n"
        "import time\n"
        "TritonHost(coalescing=CoalescingPolicy(min_window_s=0.01, max_window_s=0.01, max_chunks_per_s=100)).start()\n"
        "print('started', flush=True)\n"
        "time.sleep(600)\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        while line and line.strip() != "started":  # Triton may print its own lines first
            line = worker.stdout.readline()
        assert line.strip() == "started", "the worker started Triton"
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


def test_a_failed_bind_leaves_nothing_that_fails_the_next_one(triton: TritonHost) -> None:
    """A name this long makes the model's data socket path too long for Unix, so every bind fails;
    the second must fail for that same reason, not because the first left the name registered."""
    name = "m" * 150
    errors = []
    for _ in range(2):
        with pytest.raises(Exception) as caught:
            triton.bind(name, ScriptedEngine())
        errors.append(caught.value)
    assert type(errors[1]) is type(errors[0])
    assert "same name" not in str(errors[1])


class _BusyOnce:
    """Stands in for PyTriton's Triton: the first server's binary is "busy", as after a fork."""

    made: ClassVar[list[_BusyOnce]] = []

    def __init__(self, config: object) -> None:
        self.stopped = False
        _BusyOnce.made.append(self)

    def run(self) -> None:
        if len(_BusyOnce.made) == 1:
            raise OSError(errno.ETXTBSY, "Text file busy")

    def stop(self) -> None:
        self.stopped = True


def test_a_busy_triton_binary_is_started_again_and_the_failed_try_cleaned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(host, "Triton", _BusyOnce)
    _BusyOnce.made = []
    started = host._run_triton(TritonConfig())
    assert started is _BusyOnce.made[1]
    assert _BusyOnce.made[0].stopped and not _BusyOnce.made[1].stopped


def test_other_errors_starting_triton_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: object) -> None:
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(host, "Triton", _BusyOnce)
    monkeypatch.setattr(_BusyOnce, "run", refuse)
    _BusyOnce.made = []
    with pytest.raises(OSError, match="Permission denied"):
        host._run_triton(TritonConfig())
    assert len(_BusyOnce.made) == 1
