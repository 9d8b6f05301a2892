"""Free TCP ports and listening addresses, so that several workers, tests and benchmarks can share one machine."""

from __future__ import annotations

import functools
import ipaddress
import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@functools.cache  # the front door asks it of its own host on every request
def is_loopback_host(host: str) -> bool:
    """Whether listening on `host` keeps a server out of other machines' reach."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def local_url_host(host: str) -> str:
    """Where a client on this machine reaches a server listening on `host`, for URLs."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
