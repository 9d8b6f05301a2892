"""Tracing's switch (the OTEL_* variables), its span file, and trace ids in log lines."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from switchboard import tracing


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "console"),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None),
        ({tracing.TRACE_FILE_ENV: "/tmp/spans.jsonl"}, "file"),
    ],
)
def test_tracing_is_on_only_when_the_environment_names_an_exporter(
    environ: dict[str, str], expected: str | None
) -> None:
    assert tracing.requested(environ) == expected


def test_off_no_span_object_is_made() -> None:
    assert not tracing.enabled()
    assert tracing.span("anything") is tracing.span("else")  # one shared empty context


def test_spans_are_json_lines_with_what_a_breakdown_needs(span_file: Path) -> None:
    parent = tracing.context_from({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
    tracing.record_span("hop", 1_000, 3_000, parent=parent, attributes={"a": 1})
    (line,) = span_file.read_text().splitlines()
    record = json.loads(line)
    assert record["name"] == "hop"
    assert record["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert record["parent_id"] == "b7ad6b7169203331" and record["remote_parent"]
    assert (record["start_ns"], record["end_ns"]) == (1_000, 3_000)
    assert record["attributes"] == {"a": 1}


def test_a_carrier_names_the_span_and_keeps_extra_keys(span_file: Path) -> None:
    span = tracing.start_span("job")
    carrier = tracing.carrier_of(span, **{tracing.ENQUEUED_KEY: "123"})
    span.end()
    context = span.get_span_context()
    assert carrier["traceparent"].startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-")
    assert carrier[tracing.ENQUEUED_KEY] == "123"


def test_log_lines_inside_a_span_carry_its_ids(span_file: Path) -> None:
    record = logging.makeLogRecord({"msg": "hello"})
    with tracing.span("step") as span:
        tracing.trace_ids.filter(record)
    context = span.get_span_context()
    assert record.trace_id == f"{context.trace_id:032x}"
    assert record.span_id == f"{context.span_id:016x}"
    outside = logging.makeLogRecord({"msg": "later"})
    tracing.trace_ids.filter(outside)
    assert not hasattr(outside, "trace_id")


def test_spans_started_for_a_request_carry_its_ids(span_file: Path) -> None:
    ids = SimpleNamespace(request_id="r1", client_request_id="theirs")
    token = tracing.bind_request(ids)
    try:
        tracing.start_span("step", attributes={"a": 1}).end()
        ids.client_request_id = None
        with tracing.span("later"):
            pass
    finally:
        tracing.unbind_request(token)
    tracing.start_span("outside").end()
    step, later, outside = (json.loads(line)["attributes"] for line in span_file.read_text().splitlines())
    assert step == {tracing.REQUEST_ID: "r1", tracing.CLIENT_REQUEST_ID: "theirs", "a": 1}
    assert later == {tracing.REQUEST_ID: "r1"}
    assert outside == {}
