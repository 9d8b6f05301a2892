"""What a benchmark level makes of two readings of a process's collector pauses (`bench/gc_pauses.py`),
read from a real registry as the front door and the worker export it."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
from gc_pauses import pauses_between, read_pauses
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from switchboard.gc_heap import PAUSE_BUCKETS


@pytest.fixture
def exporter() -> Iterator[tuple[str, Histogram]]:
    """A metrics endpoint serving a pause histogram shaped like the product's."""
    registry = CollectorRegistry()
    pauses = Histogram(
        "switchboard:gc_pause_seconds", "pauses", ["generation"], buckets=PAUSE_BUCKETS, registry=registry
    )

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", pauses
    finally:
        server.shutdown()


def test_a_level_counts_the_full_collections_and_bounds_the_longest_pause(
    exporter: tuple[str, Histogram],
) -> None:
    url, pauses = exporter
    pauses.labels("2").observe(0.2)  # before the level: not counted
    before = read_pauses(url)
    for seconds in (0.0004, 0.003, 0.004):
        pauses.labels("0").observe(seconds)
    pauses.labels("2").observe(0.14)
    assert pauses_between(before, read_pauses(url)) == {
        "full_collections": 1,
        "full_ms": 140.0,
        "longest_pause_ms_at_most": 250.0,  # 0.14 s falls in the bucket up to 0.25 s
    }


def test_a_quiet_level_and_a_process_that_does_not_answer(exporter: tuple[str, Histogram]) -> None:
    url, pauses = exporter
    pauses.labels("1").observe(0.001)
    before = read_pauses(url)
    pauses.labels("0").observe(0.0007)
    assert pauses_between(before, read_pauses(url)) == {
        "full_collections": 0,
        "full_ms": 0.0,
        "longest_pause_ms_at_most": 1.0,
    }
    assert read_pauses("http://127.0.0.1:9/metrics") == {}
    assert pauses_between(before, before)["longest_pause_ms_at_most"] is None
