"""The socket a generator's Triton stub hands its requests over on, closed while a stub is still
connected (a load that failed, or the worker stopping)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from pathlib import Path

import pytest

from workers.triton.generator.job_socket import JobSocket


class _NoEngine:
    """The model side that a socket without requests never calls beyond attaching its loop."""

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        pass


def test_close_hangs_up_on_a_connected_stub_without_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lost: list[bool] = []
    job_socket = JobSocket.open(tmp_path / "jobs", _NoEngine(), "m", on_stub_lost=lambda: lost.append(True))  # type: ignore[arg-type]
    stub = socket.socket(socket.AF_UNIX)
    stub.connect(str(tmp_path / "jobs"))
    stub.settimeout(5)
    deadline = time.monotonic() + 5
    while not job_socket._connections:  # until the socket's loop reads the connection
        assert time.monotonic() < deadline, "the socket never took the stub's connection"
        time.sleep(0.01)
    caplog.set_level(logging.ERROR)
    job_socket.close()
    assert stub.recv(16) == b"", "the stub's connection ends"
    stub.close()
    assert not (tmp_path / "jobs").exists()
    assert lost == [], "a close is no stub lost"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
