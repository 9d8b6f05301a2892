"""Which of a stack's processes sends a given Redis command: for a test that must kill the process
that holds a lease (the batch runner's, say) when the lease names only an id the process made up.

Redis's MONITOR shows each command with the client's address; the client's port is a local port of
one of the processes' connections (`psutil`). Watched for a few seconds only: MONITOR costs Redis
a copy of every command.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import psutil
import pytest
import redis

from switchboard.local.launcher import Component


def local_ports(pid: int) -> set[int]:
    """The local TCP ports of the process's connections, and of its children's."""
    process = psutil.Process(pid)
    ports: set[int] = set()
    for each in [process, *process.children(recursive=True)]:
        try:
            ports.update(c.laddr.port for c in each.net_connections(kind="tcp") if c.laddr)
        except psutil.NoSuchProcess:
            continue
    return ports


def sender_of(
    redis_url: str,
    components: Sequence[Component],
    matches: Callable[[list[str]], bool],
    *,
    timeout_s: float = 10.0,
) -> Component:
    """The component that sends the next command `matches` accepts (its words, the command's name
    lower-cased); fails after `timeout_s` without one, or when no component holds its connection."""
    deadline = time.monotonic() + timeout_s
    client = redis.Redis.from_url(redis_url, socket_timeout=timeout_s)
    try:
        with client.monitor() as monitor:
            while time.monotonic() < deadline:
                command = monitor.next_command()
                words = str(command["command"]).split()
                if not words or not matches([words[0].lower(), *words[1:]]):
                    continue
                port = int(command["client_port"])
                for component in components:
                    if component.alive() and port in local_ports(component.process.pid):
                        return component
                pytest.fail(f"no process of {[c.name for c in components]} holds the connection of {words}")
    finally:
        client.close()
    pytest.fail(f"no matching Redis command within {timeout_s:g} s")
