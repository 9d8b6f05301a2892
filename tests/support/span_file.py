"""Spans written as JSON lines to a file of the test's (`tracing.JsonLinesExporter`), as
SWITCHBOARD_TRACE_FILE writes them, for tests that read what one process traced."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from switchboard import tracing


@pytest.fixture
def span_file(tmp_path: Path) -> Iterator[Path]:
    """Tracing on for the test, every span appended to the returned file as it ends."""
    path = tmp_path / "spans.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(tracing.JsonLinesExporter(path)))
    tracing.use_tracer_provider(provider)
    yield path
    tracing.use_tracer_provider(None)


def read_spans(path: Path) -> list[dict[str, Any]]:
    """The spans written so far, in the order they ended."""
    return [json.loads(line) for line in path.read_text().splitlines()]
