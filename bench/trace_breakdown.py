"""Where a streamed request's time to first token goes, hop by hop, from Switchboard's own traces.

Reads the spans a traced run wrote (`SWITCHBOARD_TRACE_FILE`, one JSON object per line, from the
front door and the worker) and, for every request, puts the moments its first token passed each hop
in order; the gaps between consecutive moments add up to the front door's time to first byte. The
breakdown is the median of each gap over the requests.

    .venv/bin/python bench/trace_breakdown.py spans.jsonl
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

Span = dict[str, Any]
Trace = dict[str, list[Span]]  # spans by name

# Each moment: (label of the hop that ends there, how to find it in one trace).
Moment = tuple[str, Callable[[Trace], int | None]]


def _start(name: str) -> Callable[[Trace], int | None]:
    return lambda trace: trace[name][0]["start_ns"] if name in trace else None


def _end(name: str) -> Callable[[Trace], int | None]:
    return lambda trace: trace[name][0]["end_ns"] if name in trace else None


def _event(span_name: str, event: str) -> Callable[[Trace], int | None]:
    def find(trace: Trace) -> int | None:
        for span in trace.get(span_name, []):
            for found in span["events"]:
                if found["name"] == event:
                    return int(found["time_ns"])
        return None

    return find


def _first_write_start(trace: Trace) -> int | None:
    writes = trace.get("switchboard.result_write", [])
    return min((span["start_ns"] for span in writes), default=None)


def is_request(trace: Trace) -> bool:
    """Whether the trace is an HTTP request's (not, say, a model load of its own)."""
    return _http_span(trace) is not None


def _http_span(trace: Trace) -> Span | None:
    for name, spans in trace.items():
        if name.startswith("POST "):
            return spans[0]
    return None


def _http_start(trace: Trace) -> int | None:
    span = _http_span(trace)
    return None if span is None else int(span["start_ns"])


def _first_byte(trace: Trace) -> int | None:
    span = _http_span(trace)
    if span is None:
        return None
    return next((int(e["time_ns"]) for e in span["events"] if e["name"] == "first_byte"), None)


MOMENTS: list[Moment] = [
    ("request arrives", _http_start),
    # The front door's own spans end only when Redis's replies are back, by when a worker may have
    # taken the job and written its first chunk: each hop ends where the next one starts instead.
    ("front door: parse, authenticate, admit, send the job", _start("switchboard.queue_wait")),
    ("queue: until a worker took the job", _end("switchboard.queue_wait")),
    ("worker: plan, into its Triton client", _start("switchboard.triton_stream")),
    ("Triton: request into the model's callable", _start("switchboard.engine.generate")),
    ("prompt: chat template and tokenizer", _end("switchboard.prompt_build")),
    ("engine: prefill to the first token", _end("switchboard.prefill")),
    (
        "coalescing window: first token to first chunk",
        _event("switchboard.engine.generate", "first_chunk_sent"),
    ),
    ("Triton back to the result writer", _first_write_start),
    ("Redis: result write to the front door's reader", _end("switchboard.await_first_chunk")),
    ("front door: relay to the first SSE byte", _first_byte),
]


def read_traces(lines: Iterable[str]) -> list[Trace]:
    """Spans grouped by trace id, each trace's spans by name (in start order); traces in the order
    they began."""
    by_trace: dict[str, Trace] = defaultdict(lambda: defaultdict(list))
    for line in lines:
        if line.strip():
            span = json.loads(line)
            by_trace[span["trace_id"]][span["name"]].append(span)
    for trace in by_trace.values():
        for spans in trace.values():
            spans.sort(key=lambda span: span["start_ns"])
    traces = [dict(trace) for trace in by_trace.values()]
    traces.sort(key=lambda trace: min(spans[0]["start_ns"] for spans in trace.values()))
    return traces


def breakdown(traces: list[Trace]) -> list[tuple[str, float | None]]:
    """(hop, median milliseconds) for every hop, over the traces that have both its ends; the
    last row is the median time from the request's arrival to its first byte."""
    gaps: dict[str, list[float]] = defaultdict(list)
    totals: list[float] = []
    for trace in traces:
        times = [find(trace) for _, find in MOMENTS]
        if times[0] is None or times[-1] is None:
            continue
        totals.append((times[-1] - times[0]) / 1e6)
        previous = times[0]
        for (label, _), moment in zip(MOMENTS[1:], times[1:], strict=True):
            if moment is None:
                continue  # a hop not traced (say, no prompt build): the next gap includes it
            gaps[label].append((moment - previous) / 1e6)
            previous = moment
    rows: list[tuple[str, float | None]] = [
        (label, statistics.median(gaps[label]) if gaps[label] else None) for label, _ in MOMENTS[1:]
    ]
    rows.append(("time to first byte at the front door", statistics.median(totals) if totals else None))
    return rows


def format_breakdown(rows: list[tuple[str, float | None]], requests: int) -> str:
    """The breakdown as a small table."""
    width = max(len(label) for label, _ in rows)
    lines = [f"Time to first token, hop by hop (median ms over {requests} traced requests)"]
    for label, value in rows:
        lines.append(f"  {label.ljust(width)}  {'-' if value is None else f'{value:8.2f}'}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    traces = [t for t in read_traces(Path(argv[0]).read_text().splitlines()) if is_request(t)]
    print(format_breakdown(breakdown(traces), len(traces)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
