"""This machine's addresses, for tests that check what a server can be reached on."""

from __future__ import annotations

import contextlib
import ipaddress
import socket

import pytest


def non_loopback_ipv4() -> str:
    """An IPv4 address of this machine other than loopback; skips the test where there is none."""
    candidates: set[str] = set()
    with contextlib.suppress(ImportError):
        import psutil

        for addresses in psutil.net_if_addrs().values():
            candidates.update(a.address for a in addresses if a.family == socket.AF_INET)
    with contextlib.suppress(OSError):
        for *_, sockaddr in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            candidates.add(str(sockaddr[0]))
    usable = sorted(a for a in candidates if not ipaddress.ip_address(a).is_loopback)
    if not usable:
        pytest.skip("this machine has no non-loopback IPv4 address")
    return usable[0]


def connection_refused(address: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection to `address:port` is refused: nothing listens there for that address."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return False
    except ConnectionRefusedError:
        return True


def accepts(address: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection to `address:port` is accepted."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return True
    except OSError:
        return False
