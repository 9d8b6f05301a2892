"""The embeddings benchmark's pieces that need no engine: its texts, its load against a local HTTP
server, the stacks' config, and what it makes of its figures (`bench/embedding_*.py`)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from embedding_costs import cpu_by_kind
from embedding_load import MAX_WORDS, MIN_WORDS, bench_texts, closed_loop, summarize
from embedding_servers import MODEL, embedder_config
from embedding_summary import summarize_runs, targets
from proc_cpu import Process, Snapshot

from switchboard.config import load_settings
from switchboard.local.demo_pooling_models import _make_tokenizer
from switchboard.local.toml_text import toml_text


def test_the_texts_are_the_same_every_run_and_a_few_words_to_about_sixty_tokens() -> None:
    texts = bench_texts()
    assert texts == bench_texts()
    assert bench_texts(seed=1) != texts
    word_counts = [len(text.split()) for text in texts]
    assert min(word_counts) >= MIN_WORDS and max(word_counts) <= MAX_WORDS
    tokens = [len(ids) for ids in _make_tokenizer()(texts)["input_ids"]]
    assert min(tokens) <= 8, "some texts are a few words"
    assert 40 <= max(tokens) <= 64, "the longest are about 60 tokens"


class FakeEmbedder:
    """A local HTTP server answering embeddings requests after a short wait; it notes the texts it
    got and the most requests it held at once."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.texts.append(body["input"])
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.005)
        self.in_flight -= 1
        if body["input"] == "refuse me":
            return web.json_response({"error": {"message": "no"}}, status=400)
        vector = base64.b64encode(b"\x00" * 16).decode()
        return web.json_response({"data": [{"index": 0, "embedding": vector}]})


@pytest.fixture
async def fake_embedder() -> AsyncIterator[tuple[str, FakeEmbedder]]:
    fake = FakeEmbedder()
    app = web.Application()
    app.router.add_post("/v1/embeddings", fake.embeddings)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", fake
    await runner.cleanup()


async def test_the_closed_loop_sends_each_text_in_turn_with_at_most_so_many_in_flight(
    fake_embedder: tuple[str, FakeEmbedder],
) -> None:
    base_url, fake = fake_embedder
    texts = ["one", "two", "three"]
    answers, wall_s = await closed_loop(base_url, MODEL, texts, concurrency=4, requests=10)
    assert len(answers) == 10 and all(answer.error is None for answer in answers)
    assert sorted(fake.texts) == sorted(texts * 3 + ["one"])
    assert fake.most_in_flight == 4
    assert wall_s >= 0.005 * 10 / 4


async def test_a_refused_request_is_an_error_and_not_counted_as_served(
    fake_embedder: tuple[str, FakeEmbedder],
) -> None:
    base_url, _ = fake_embedder
    answers, wall_s = await closed_loop(base_url, MODEL, ["fine", "refuse me"], concurrency=1, requests=4)
    level = summarize(answers, 1, wall_s)
    assert level.errors == 2 and level.requests == 4
    assert level.requests_per_s == pytest.approx(2 / wall_s, rel=0.01)
    assert level.error_samples == ['HTTP 400: {"error": {"message": "no"}}']


def test_the_stacks_config_is_an_embedder_with_the_batching_asked_for(tmp_path: Path) -> None:
    path = tmp_path / "switchboard.toml"
    path.write_text(toml_text(embedder_config(tmp_path / "model", {"enabled": False, "queue_delay_ms": 7.5})))
    (model,) = load_settings(path, environ={}).models
    assert (model.name, model.kind, model.preload) == (MODEL, "embed", True)
    assert not model.batching.enabled and model.batching.queue_delay_ms == 7.5


def level(concurrency: int, requests_per_s: float, p50_ms: float, errors: int = 0) -> dict[str, Any]:
    return {
        "concurrency": concurrency,
        "requests_per_s": requests_per_s,
        "p50_ms": p50_ms,
        "p99_ms": p50_ms * 2,
        "errors": errors,
    }


def run(system: str, *levels: dict[str, Any]) -> dict[str, Any]:
    return {"system": system, "levels": list(levels)}


RUNS = [
    run("batcher-on", level(1, 90, 9.0), level(32, 900, 30.0, errors=1)),
    run("batcher-on", level(1, 110, 11.0), level(32, 1100, 40.0)),
    run("batcher-off", level(1, 120, 4.0), level(32, 250, 120.0)),
    run("vllm", level(1, 100, 10.0), level(32, 1000, 30.0)),
]


def test_the_summary_is_the_median_over_rounds_with_errors_summed_and_the_ratios() -> None:
    rows = summarize_runs(RUNS, [1, 32], ["batcher-on", "batcher-off", "vllm"])
    assert [row["concurrency"] for row in rows] == [1, 32]
    high = rows[1]
    assert high["systems"]["batcher-on"] == {
        "requests_per_s": 1000,
        "p50_ms": 35.0,
        "p99_ms": 70.0,
        "errors": 1,
        "costs": None,
    }
    assert high["ratios"]["on_off_requests_per_s"] == 4.0
    assert high["ratios"]["sb_vllm_requests_per_s"] == 1.0
    assert high["ratios"]["sb_vllm_p50_ms"] == pytest.approx(1.167, abs=0.001)


def test_each_target_is_judged_where_it_applies() -> None:
    checks = targets(summarize_runs(RUNS, [1, 32], ["batcher-on", "batcher-off", "vllm"]), queue_delay_ms=5.0)
    by_name = {(check["concurrency"], check["target"]): check for check in checks}
    assert len(checks) == 4
    # c=1: the batcher's p50 (10 ms) is 6 ms above batching off's (4 ms): within 5 + 2 ms.
    c1 = by_name[1, "p50 added by the batcher (ms)"]
    assert (c1["value"], c1["limit"], c1["met"]) == (6.0, 7.0, True)
    assert by_name[32, "req/s batcher on / off"]["met"] is True
    assert by_name[32, "req/s SB / vLLM"]["met"] is True
    assert by_name[32, "p50 SB / vLLM"]["met"] is True
    missed = targets(summarize_runs(RUNS, [1, 32], ["batcher-on", "batcher-off", "vllm"]), queue_delay_ms=3.0)
    assert [check["met"] for check in missed if check["concurrency"] == 1] == [False]


def test_a_target_whose_system_was_not_run_is_not_measured_rather_than_missed() -> None:
    rows = summarize_runs(RUNS, [32], ["batcher-on", "vllm"])
    checks = {check["target"]: check["met"] for check in targets(rows, queue_delay_ms=5.0)}
    assert checks == {"req/s batcher on / off": None, "req/s SB / vLLM": True, "p50 SB / vLLM": True}


def test_the_costs_are_medians_over_rounds_with_a_process_missing_from_a_round_counted_as_zero() -> None:
    def costs(cpu: dict[str, float], rows: float | None) -> dict[str, Any]:
        wait = None if rows is None else 2.0
        return {
            "cpu_ms_per_request": cpu,
            "busy_cores": 1.5,
            "batch_rows_mean": rows,
            "batcher_wait_ms_mean": wait,
        }

    runs = [
        run("batcher-on", {**level(8, 100, 10.0), "costs": costs({"worker": 3.0, "front door": 1.0}, 4.0)}),
        run("batcher-on", {**level(8, 100, 10.0), "costs": costs({"worker": 5.0}, 6.0)}),
        run("vllm", {**level(8, 100, 10.0), "costs": costs({"vLLM engine core": 2.0}, None)}),
    ]
    (row,) = summarize_runs(runs, [8], ["batcher-on", "vllm"])
    on = row["systems"]["batcher-on"]["costs"]
    assert on["cpu_ms_per_request"] == {"worker": 4.0, "front door": 0.5}
    assert (on["batch_rows_mean"], on["batcher_wait_ms_mean"], on["busy_cores"]) == (5.0, 2.0, 1.5)
    assert row["systems"]["vllm"]["costs"]["batch_rows_mean"] is None


def test_cpu_by_kind_adds_up_each_kinds_processes_and_counts_a_new_one_from_zero() -> None:
    def snap(*processes: tuple[int, str, float]) -> Snapshot:
        return Snapshot({pid: Process(pid, 1, kind, (), cpu) for pid, kind, cpu in processes}, {})

    before = snap((10, "worker", 1.0), (11, "tritonserver", 2.0))
    after = snap((10, "worker", 1.5), (11, "tritonserver", 2.1), (12, "tritonserver", 0.3))
    assert cpu_by_kind(before, after) == pytest.approx({"worker": 0.5, "tritonserver": 0.4})
    assert list(cpu_by_kind(before, after)) == ["worker", "tritonserver"]
    vllm = snap((20, "other: python -m vllm.entrypoints.openai.api_server --model", 1.0))
    assert cpu_by_kind(snap(), vllm) == {"vLLM API server": 1.0}
    guards = snap((30, "other: python -m guard 17", 0.5), (31, "other: python -m guard 18", 0.25))
    assert cpu_by_kind(snap(), guards) == {"other: python -m guard": 0.75}
