"""Traces and metrics of the real stack: front door and worker processes, vLLM on the demo model.

Both processes of the shared stack (tests/e2e/conftest.py) export their spans to one JSON-lines file
(`SWITCHBOARD_TRACE_FILE`); they are joined by trace id. The version asked for is loaded by no other
test, so the request waits for a cold start.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from switchboard import keys
from switchboard.wire import worker_decoder
from tests.support.stack import SPANS_FILE, TRACED_VERSION, Stack

pytestmark = pytest.mark.e2e

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"
# The version asked for: no other test loads it.
MODEL = TRACED_VERSION


def test_a_streamed_request_is_one_trace_across_both_processes_with_a_cold_start(stack: Stack) -> None:
    spans_file = stack.log_dir / SPANS_FILE
    with OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=600) as client:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"traceparent": TRACEPARENT},
        )
        usage = [chunk.usage for chunk in stream if chunk.usage is not None][-1]
    spans = stack.wait_until(
        lambda: _complete_trace(spans_file), timeout_s=30, what="both processes' spans of the request"
    )
    front = _scrape(f"{stack.base_url}/metrics")
    worker = _scrape(f"http://127.0.0.1:{_worker_metrics_port(stack)}/metrics")

    by_name = {span["name"]: span for span in spans}
    assert {span["service"] for span in spans} == {"switchboard-router", "switchboard-worker"}
    http = by_name["POST /v1/chat/completions"]
    assert http["parent_id"] == "b7ad6b7169203331" and http["remote_parent"], "the caller's traceparent"

    def parent(name: str) -> str:
        return str(by_name[name]["parent_id"])

    chat = by_name[f"chat {MODEL}"]
    assert chat["parent_id"] == http["span_id"]
    for name in ("switchboard.admission", "switchboard.enqueue", "switchboard.relay"):
        assert parent(name) == chat["span_id"], name
    # The worker's spans continue the front door's, across Redis.
    for name in ("switchboard.queue_wait", "switchboard.cold_start", "switchboard.job"):
        assert parent(name) == chat["span_id"] and by_name[name]["remote_parent"], name
    assert parent("switchboard.triton_stream") == by_name["switchboard.job"]["span_id"]
    # ... and through Triton into the engine.
    engine = by_name["switchboard.engine.generate"]
    assert engine["parent_id"] == by_name["switchboard.triton_stream"]["span_id"]
    for name in ("switchboard.prompt_build", "switchboard.prefill", "switchboard.decode"):
        assert parent(name) == engine["span_id"], name

    job = by_name["switchboard.job"]["attributes"]
    assert job["switchboard.cold_start"] is True
    assert job["gen_ai.operation.name"] == "chat" and job["gen_ai.request.model"] == MODEL
    assert job["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert job["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    cold = by_name["switchboard.cold_start"]
    assert cold["attributes"]["switchboard.cold_start.tier"] == "cold"
    assert cold["attributes"]["gen_ai.request.model"] == MODEL
    assert chat["attributes"]["gen_ai.response.finish_reasons"] == ["length"]
    # The hops of the first token follow one another in time.
    prefill, decode = by_name["switchboard.prefill"], by_name["switchboard.decode"]
    assert by_name["switchboard.queue_wait"]["end_ns"] <= by_name["switchboard.job"]["start_ns"] + 1_000_000
    assert prefill["end_ns"] <= decode["start_ns"] + 1
    assert decode["end_ns"] <= by_name["switchboard.relay"]["end_ns"]

    assert front[("switchboard:requests_total", (("model", MODEL), ("route", ""), ("status", "200")))] >= 1
    assert (
        front[("switchboard:generation_tokens_total", (("model", MODEL), ("route", "")))]
        >= usage.completion_tokens
    )
    assert worker[("switchboard:model_loads_total", (("model", MODEL), ("outcome", "ok")))] == 1
    assert worker[("switchboard:model_load_seconds_count", (("model", MODEL),))] == 1
    # The request waited for that load: its wait, by model and route (none named here).
    assert (
        worker[("switchboard:request_cold_start_wait_seconds_count", (("model", MODEL), ("route", "")))] == 1
    )
    assert any(name.startswith("nv_inference") for name, _ in worker), "Triton's metrics on the worker's port"
    # Both processes froze what they made at start-up out of full collections, and time every pause.
    for process in (front, worker):
        assert process[("switchboard:gc_frozen_objects", ())] > 10_000
        assert process[("switchboard:gc_pause_seconds_count", (("generation", "0"),))] >= 1


def _complete_trace(path: Path) -> list[dict[str, Any]] | None:
    if not path.exists():
        return None
    spans = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    ours = [span for span in spans if span["trace_id"] == TRACE_ID]
    names = {span["name"] for span in ours}
    needed = {
        "POST /v1/chat/completions",
        "switchboard.job",
        "switchboard.decode",
        "switchboard.engine.generate",
    }
    return ours if needed <= names else None


def _worker_metrics_port(stack: Stack) -> int:
    client = redis.Redis.from_url(stack.redis_url)
    (worker_id,) = client.zrange(keys.workers_index(), 0, -1)
    record = worker_decoder.decode(client.get(keys.worker_record(worker_id.decode())))  # type: ignore[arg-type]
    assert record.metrics_port > 0
    return record.metrics_port


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
