"""One request through the front door and a worker's real pieces (Redis, Triton, consumer, a scripted
engine), traced with an in-memory exporter and counted by the metrics both sides serve.

The model is cold when the request arrives and loads while its job waits, so the trace holds a cold
start. The end-to-end test with real processes and vLLM is tests/e2e/test_observability.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from router.endpoints.metrics import QUEUES_MAX_AGE_S
from switchboard import tracing
from switchboard.config import ModelConfig
from switchboard.local.redis_server import PrivateRedis
from tests.support.front_door_harness import serving, settings_for
from tests.support.one_worker import running_worker
from tests.support.scripted_engine import ScriptedEngine
from tests.support.waits import eventually
from workers.models.slot import ModelSlot
from workers.runtime.metrics_server import MetricsServer
from workers.runtime.worker_metrics import SLOTS

MODEL = "observed"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
TOKENS = 5


class Stack:
    def __init__(self, client: httpx.AsyncClient, slot: ModelSlot, worker_metrics_url: str) -> None:
        self.client = client
        self.slot = slot
        self.worker_metrics_url = worker_metrics_url


@asynccontextmanager
async def observed_stack() -> AsyncIterator[Stack]:
    """A front door and a worker whose model is cold until the test warms it."""
    with PrivateRedis() as server:
        async with running_worker(
            model=MODEL,
            window_s=0.001,
            engine=ScriptedEngine(start_s=0.2),
            warm=False,
            worker_id="w-observed",
            redis_url=server.url,
        ) as worker:
            SLOTS.add("w-observed", {MODEL: worker.slot})
            host = worker.host
            metrics = MetricsServer("127.0.0.1", 0, lambda: f"http://127.0.0.1:{host.metrics_port}/metrics")
            port = await metrics.start()
            settings = settings_for(server.url, 30.0, models=[ModelConfig(name=MODEL, path="unused")])
            try:
                async with serving(settings) as client:
                    yield Stack(client, worker.slot, f"http://127.0.0.1:{port}/metrics")
            finally:
                await metrics.stop()
                SLOTS.remove("w-observed")


@pytest.fixture
def spans() -> AsyncIterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)
    yield exporter  # type: ignore[misc]
    tracing.use_tracer_provider(None)
    provider.shutdown()


async def streamed_completion(stack: Stack, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    body = {
        "model": MODEL,
        "prompt": f"fast {TOKENS}",
        "stream": True,
        "max_tokens": TOKENS,
        "temperature": 0.5,
    }
    async with stack.client.stream("POST", "/v1/completions", json=body, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        text = (await response.aread()).decode()
    events = [block.split("data: ", 1)[1] for block in text.split("\n\n") if "data: " in block]
    assert events[-1] == "[DONE]"
    return [json.loads(event) for event in events[:-1]]


async def warm_after_the_job_is_queued(stack: Stack) -> None:
    await asyncio.sleep(0.3)  # the request is admitted and its job waits in the queue
    await stack.slot.ensure_warm()


async def test_one_streamed_request_is_one_trace_across_every_hop(spans: InMemorySpanExporter) -> None:
    async with observed_stack() as stack:
        warming = asyncio.create_task(warm_after_the_job_is_queued(stack))
        events = await streamed_completion(stack, {"traceparent": TRACEPARENT})
        await warming
        await asyncio.sleep(0.2)  # the worker's job span ends after its last write
    finished = spans.get_finished_spans()
    assert {s.context.trace_id for s in finished} == {int(TRACE_ID, 16)}, "one trace, the caller's"
    by_name = {s.name: s for s in finished}
    parent_of = {s.context.span_id: s.parent.span_id if s.parent else None for s in finished}

    def is_child(child: str, parent: str) -> bool:
        return parent_of[by_name[child].context.span_id] == by_name[parent].context.span_id

    http = by_name["POST /v1/completions"]
    assert http.parent is not None and http.parent.span_id == 0x00F067AA0BA902B7, (
        "incoming traceparent honoured"
    )
    assert [event.name for event in http.events] == ["first_byte"]
    job_span = f"text_completion {MODEL}"
    for child in ("switchboard.authenticate", job_span):
        assert is_child(child, "POST /v1/completions"), child
    for child in (
        "switchboard.admission",
        "switchboard.enqueue",
        "switchboard.await_first_chunk",
        "switchboard.relay",
        "switchboard.queue_wait",
        "switchboard.cold_start",
        "switchboard.job",
    ):
        assert is_child(child, job_span), child
    assert is_child("switchboard.triton_stream", "switchboard.job")
    assert is_child("switchboard.engine.generate", "switchboard.triton_stream")
    writes = [s for s in finished if s.name == "switchboard.result_write"]
    assert {w.attributes["switchboard.chunk"] for w in writes} == {"first", "last"}  # type: ignore[index]

    front = by_name[job_span].attributes or {}
    assert front["gen_ai.operation.name"] == "text_completion"
    assert front["gen_ai.request.model"] == MODEL
    assert front["gen_ai.request.max_tokens"] == TOKENS
    assert front["gen_ai.request.temperature"] == 0.5
    assert front["gen_ai.response.model"] == MODEL
    assert front["gen_ai.usage.input_tokens"] == 3
    assert front["gen_ai.usage.output_tokens"] == TOKENS
    assert list(front["gen_ai.response.finish_reasons"]) == ["length"]  # type: ignore[arg-type]
    worker = by_name["switchboard.job"].attributes or {}
    assert worker["switchboard.worker.id"] == "w-observed"
    assert worker["switchboard.cold_start"] is True
    assert worker["gen_ai.usage.output_tokens"] == TOKENS
    cold = by_name["switchboard.cold_start"]
    assert (cold.attributes or {})["switchboard.cold_start.tier"] == "cold"
    assert (cold.attributes or {})["gen_ai.request.model"] == MODEL
    assert _seconds(cold) >= 0.2, "the scripted engine takes 0.2 s to start"
    engine_events = [e.name for e in by_name["switchboard.engine.generate"].events]
    assert engine_events == ["first_output", "first_chunk_sent"]
    # The hops follow one another in time: queue wait ends when the worker takes the job.
    assert by_name["switchboard.queue_wait"].end_time <= by_name["switchboard.job"].start_time + 1  # type: ignore[operator]
    assert by_name["switchboard.enqueue"].end_time <= by_name["switchboard.await_first_chunk"].end_time  # type: ignore[operator]
    assert sum(len(e["choices"][0]["text"]) > 0 for e in events) >= 1


async def test_a_warm_model_has_no_cold_start_and_tracing_off_records_nothing(
    spans: InMemorySpanExporter,
) -> None:
    async with observed_stack() as stack:
        await stack.slot.ensure_warm()
        await streamed_completion(stack)
        await asyncio.sleep(0.2)
        names = [s.name for s in spans.get_finished_spans()]
        assert "switchboard.job" in names and "switchboard.cold_start" not in names
        worker = next(s for s in spans.get_finished_spans() if s.name == "switchboard.job")
        assert (worker.attributes or {})["switchboard.cold_start"] is False
        spans.clear()
        tracing.use_tracer_provider(None)
        await streamed_completion(stack)
        await asyncio.sleep(0.2)
        assert spans.get_finished_spans() == ()


async def test_metrics_move_by_the_right_amounts_after_known_traffic() -> None:
    async with observed_stack() as stack:
        await stack.slot.ensure_warm()
        front_before = await _scrape(stack.client, "/metrics")
        worker_before = await _scrape(httpx.AsyncClient(), stack.worker_metrics_url)
        for _ in range(3):
            await streamed_completion(stack)
        bad = await stack.client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": -1}
        )
        assert bad.status_code == 400
        await asyncio.sleep(0.2)
        front = await _scrape(stack.client, "/metrics")
        worker = await _scrape(httpx.AsyncClient(), stack.worker_metrics_url)

    def moved(
        after: dict[tuple[str, tuple[tuple[str, str], ...]], float], before: Any, name: str, **labels: str
    ) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert moved(front, front_before, "switchboard:requests_total", model=MODEL, route="", status="200") == 3
    # Refused before its model was read: counted without one.
    assert moved(front, front_before, "switchboard:requests_total", model="", route="", status="400") == 1
    assert (
        moved(front, front_before, "switchboard:time_to_first_token_seconds_count", model=MODEL, route="")
        == 3
    )
    assert (
        moved(front, front_before, "switchboard:e2e_request_latency_seconds_count", model=MODEL, route="")
        == 3
    )
    assert (
        moved(front, front_before, "switchboard:time_per_output_token_seconds_count", model=MODEL, route="")
        == 3
    )
    assert (
        moved(front, front_before, "switchboard:generation_tokens_total", model=MODEL, route="") == 3 * TOKENS
    )
    assert moved(front, front_before, "switchboard:prompt_tokens_total", model=MODEL, route="") == 3 * 3
    assert (
        moved(
            front,
            front_before,
            "switchboard:request_success_total",
            model=MODEL,
            route="",
            finished_reason="length",
        )
        == 3
    )
    assert moved(front, front_before, "switchboard:redis_round_trips_total", client="pooled") > 0
    assert front[("switchboard:num_requests_waiting", (("model", MODEL),))] == 0
    assert moved(worker, worker_before, "switchboard:worker_jobs_total", model=MODEL, outcome="finished") == 3
    assert (
        moved(worker, worker_before, "switchboard:request_queue_time_seconds_count", model=MODEL, route="")
        == 3
    )
    assert (
        moved(worker, worker_before, "switchboard:worker_time_to_first_chunk_seconds_count", model=MODEL) == 3
    )
    assert (
        moved(worker, worker_before, "switchboard:engine_time_to_first_token_seconds_count", model=MODEL) == 3
    )
    resident = ("switchboard:model_resident", (("model", MODEL), ("state", "warm"), ("worker", "w-observed")))
    assert worker[resident] == 1
    assert any(name.startswith("nv_") for name, _ in worker), "Triton's own metrics follow"


async def test_the_queue_gauges_tell_depth_and_the_oldest_jobs_age() -> None:
    async with observed_stack() as stack:  # the model stays cold: jobs wait
        body = {"model": MODEL, "prompt": "fast 1", "max_tokens": 1}
        waiting = [asyncio.create_task(stack.client.post("/v1/completions", json=body)) for _ in range(2)]
        await asyncio.sleep(1.2)
        front = await _scrape(stack.client, "/metrics")
        assert front[("switchboard:num_requests_waiting", (("model", MODEL),))] == 2
        assert front[("switchboard:oldest_waiting_seconds", (("model", MODEL),))] >= 1.0
        await stack.slot.ensure_warm()
        assert all(r.status_code == 200 for r in await asyncio.gather(*waiting))

        # Scrapes share a read of the queues up to QUEUES_MAX_AGE_S old: the load may end sooner.
        async def none_waiting() -> bool:
            front = await _scrape(stack.client, "/metrics")
            return front[("switchboard:num_requests_waiting", (("model", MODEL),))] == 0

        await eventually(none_waiting, timeout_s=QUEUES_MAX_AGE_S + 5)


async def _scrape(
    client: httpx.AsyncClient, url: str
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = await client.get(url)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _seconds(span: ReadableSpan) -> float:
    assert span.start_time is not None and span.end_time is not None
    return (span.end_time - span.start_time) / 1e9
