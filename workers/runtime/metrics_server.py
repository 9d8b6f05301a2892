"""The worker's metrics port: `GET /metrics` answers this worker's metrics, then its Triton's;
`GET /healthz` says the worker's event loop answers, `GET /readyz` whether it takes jobs (the
probes of an orchestrator).

A worker has no HTTP server of its own otherwise (Triton's listen on loopback only), so this is a
small one on the worker's event loop. It listens on `worker.metrics_host` (loopback by default) and
the first free port from `worker.metrics_port` on (up to `PORT_RANGE` ports), so that several
workers on one machine each get one at once; 0 takes any free port. The port it got is logged and
advertised in the worker's heartbeat record (`WorkerRecord.metrics_port`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.request
from collections.abc import Callable

from switchboard.metrics import CONTENT_TYPE, exposition

logger = logging.getLogger(__name__)

# Ports tried from worker.metrics_port on before giving up.
PORT_RANGE = 64
# A scrape waits at most this long for Triton's own metrics (it answers in milliseconds).
TRITON_TIMEOUT_S = 2.0
# Requests are one line and a few headers: more than this is not a scrape.
MAX_REQUEST_BYTES = 16 * 1024


class MetricsServer:
    """Serves this process's metrics, and Triton's, over plain HTTP/1.1."""

    def __init__(
        self,
        host: str,
        port: int,
        triton_metrics_url: Callable[[], str | None],
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        """`triton_metrics_url()` says where Triton's metrics are (None until Triton runs); `ready()`
        whether the worker takes jobs."""
        self._host = host
        self._port = port
        self._triton_metrics_url = triton_metrics_url
        self._ready = ready
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        """Listen on the first free port of the range; returns it."""
        ports = [0] if self._port == 0 else range(self._port, min(self._port + PORT_RANGE, 65536))
        error: OSError | None = None
        for port in ports:
            try:
                self._server = await asyncio.start_server(self._serve, self._host, port)
            except OSError as exc:
                error = exc
                continue
            self.port = self._server.sockets[0].getsockname()[1]
            logger.info(
                f"metrics on http://{self._host}:{self.port}/metrics",
                extra={"host": self._host, "port": self.port},
            )
            return self.port
        raise OSError(f"no free port for the worker's metrics from {self._port} on: {error}")

    async def stop(self) -> None:
        """Stop listening; idempotent."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
            if len(head) > MAX_REQUEST_BYTES:
                raise ValueError("request too large")
            method, path, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            path = path.split("?", 1)[0]
            if method != "GET" or path not in ("/metrics", "/healthz", "/readyz"):
                await _answer(writer, 404, b"not found; try /metrics, /healthz or /readyz\n", "text/plain")
            elif path == "/healthz":
                await _answer(writer, 200, b"ok\n", "text/plain")
            elif path == "/readyz":
                ready = self._ready()
                await _answer(
                    writer, 200 if ready else 503, b"ready\n" if ready else b"not taking jobs\n", "text/plain"
                )
            else:
                body = exposition() + await self._triton_metrics()
                await _answer(writer, 200, body, CONTENT_TYPE)
        except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a client that went away or spoke something else: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _triton_metrics(self) -> bytes:
        url = self._triton_metrics_url()
        if url is None:
            return b""
        try:
            return await asyncio.to_thread(_fetch, url)
        except OSError:
            logger.debug("Triton's metrics could not be read", exc_info=True)
            return b""


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=TRITON_TIMEOUT_S) as response:
        body: bytes = response.read()
    return body if body.endswith(b"\n") or not body else body + b"\n"


async def _answer(writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str) -> None:
    reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + body)
    await writer.drain()
