"""A pooling model's batched Triton model against a real PyTriton host and the demo embedder.

Triton's dynamic batcher groups concurrent jobs into one engine call (seen in the batch-size
metric), and each job still gets exactly its own rows back; with batching off each request runs
alone; a job larger than a batch goes in parts and comes back whole, in order; a refused input
fails its own job only; a job whose deadline passes is answered with a timeout, and the model's
stream goes on; the next batch reaches the engine while one computes (the model is decoupled); an
engine that fails fails its batch's requests (the consumer answers their jobs with an engine error).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest
import pytest_asyncio

from switchboard.config import ModelConfig, triton_model_name
from switchboard.local.demo_pooling_models import build_demo_embedder
from switchboard.metrics import REGISTRY
from switchboard.pooling_config import BatchingConfig
from switchboard.wire import Chunk, Job, chunk_decoder, encode
from tests.support.pooling_jobs import cosine, embed_job, rows
from workers.engines.base import InvalidEngineRequest, PooledRow, PoolingRow
from workers.engines.torch_pooling import TorchPoolingEngine
from workers.triton.client import TritonStreamError
from workers.triton.host import TritonHost
from workers.triton.model import CoalescingPolicy
from workers.triton.pooling_client import PoolingJobClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

BATCHED, ALONE, SMALL, FAILING, SLOW = "batched", "alone", "small", "failing", "slow"
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "routers", "send", "requests")


class FailingEngine(TorchPoolingEngine):
    """The demo embedder, whose every engine call fails (our bug, not the client's)."""

    async def pool(self, rows: Sequence[PoolingRow]) -> list[PooledRow | InvalidEngineRequest]:
        raise RuntimeError("the engine broke")


class SlowEngine(TorchPoolingEngine):
    """The demo embedder, each call held 0.3 s first; counts the calls in progress at once and the
    rows of each call."""

    def __init__(self, model: ModelConfig) -> None:
        super().__init__(model)
        self.in_progress = 0
        self.most_at_once = 0
        self.rows_per_call: list[int] = []
        self.computing = asyncio.Event()

    async def pool(self, rows: Sequence[PoolingRow]) -> list[PooledRow | InvalidEngineRequest]:
        self.in_progress += 1
        self.most_at_once = max(self.most_at_once, self.in_progress)
        self.rows_per_call.append(len(rows))
        self.computing.set()
        try:
            await asyncio.sleep(0.3)
            return await super().pool(rows)
        finally:
            self.in_progress -= 1


@dataclass
class Models:
    host: TritonHost
    engines: dict[str, TorchPoolingEngine]
    clients: dict[str, PoolingJobClient]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def models(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Models]:
    folder = str(build_demo_embedder(tmp_path_factory.mktemp("embedder") / "model"))
    configs = [
        # A wide window, so that concurrent jobs surely meet on a loaded machine.
        ModelConfig(name=BATCHED, path=folder, kind="embed", batching=BatchingConfig(queue_delay_ms=50.0)),
        ModelConfig(name=ALONE, path=folder, kind="embed", batching=BatchingConfig(enabled=False)),
        ModelConfig(
            name=SMALL,
            path=folder,
            kind="embed",
            batching=BatchingConfig(max_batch_size=8, preferred_batch_sizes=[8]),
        ),
    ]
    host = TritonHost(coalescing=CoalescingPolicy(min_window_s=0.0, max_window_s=0.0, max_chunks_per_s=1e6))
    await asyncio.to_thread(host.start)
    engines = {config.name: TorchPoolingEngine(config) for config in configs}
    engines[FAILING] = FailingEngine(ModelConfig(name=FAILING, path=folder, kind="embed"))
    engines[SLOW] = SlowEngine(ModelConfig(name=SLOW, path=folder, kind="embed"))
    await asyncio.gather(
        *(engine.start() for engine in engines.values()),
        *(asyncio.to_thread(host.bind, name, engine) for name, engine in engines.items()),
    )
    clients = {
        name: PoolingJobClient(
            host.grpc_address,
            triton_model_name(name),
            max_batch_size=engine.model.batching.max_batch_size,
            together=engine.model.batching.enabled,
        )
        for name, engine in engines.items()
    }
    try:
        yield Models(host, engines, clients)
    finally:
        for name, client in clients.items():
            await client.close()
            await engines[name].stop()
        await asyncio.to_thread(host.stop)


async def answer(client: PoolingJobClient, job: Job) -> Chunk:
    (raw,) = [raw async for raw in client.stream(encode(job))]
    chunk = chunk_decoder.decode(raw)
    assert chunk.is_last
    return chunk


async def alone(engine: TorchPoolingEngine, item: str | tuple[int, ...]) -> npt.NDArray[np.float32]:
    """The text's embedding computed on its own, straight from the engine."""
    (row,) = await engine.pool([PoolingRow(task="embed", input=item)])
    assert isinstance(row, PooledRow)
    return np.frombuffer(row.values, dtype="<f4")


def batches(model: str) -> tuple[float, float, float]:
    """The batch-size histogram so far: engine calls, rows, and calls of one row."""
    labels = {"model": model}
    calls = REGISTRY.get_sample_value("switchboard:pooling_batch_rows_count", labels) or 0.0
    total = REGISTRY.get_sample_value("switchboard:pooling_batch_rows_sum", labels) or 0.0
    single = (
        REGISTRY.get_sample_value("switchboard:pooling_batch_rows_bucket", {**labels, "le": "1.0"}) or 0.0
    )
    return calls, total, single


def triton_requests(model: str) -> float:
    return REGISTRY.get_sample_value("switchboard:pooling_requests_total", {"model": model}) or 0.0


def text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 120)))


async def test_concurrent_jobs_are_batched_and_each_gets_its_own_rows(models: Models) -> None:
    rng = random.Random(7)
    jobs = [embed_job(BATCHED, *(text(rng) for _ in range(rng.choice((1, 1, 3))))) for _ in range(64)]
    calls_before, rows_before, single_before = batches(BATCHED)
    requests_before = triton_requests(BATCHED)
    together = await asyncio.gather(*(answer(models.clients[BATCHED], job) for job in jobs))
    calls, total, single = batches(BATCHED)
    # Jobs handed over together travel together: fewer Triton requests than jobs.
    assert triton_requests(BATCHED) - requests_before < len(jobs)
    assert total - rows_before == sum(len(job.pooling.inputs) for job in jobs if job.pooling)
    # Fewer engine calls than jobs: the batcher grouped them, some calls with more than one row.
    assert calls - calls_before < len(jobs)
    assert (calls - calls_before) - (single - single_before) > 0, "no batch of more than one row"
    for job, chunk in zip(jobs, together, strict=True):
        assert job.pooling is not None
        assert len(chunk.pooled) == len(job.pooling.inputs)
        for item, row in zip(job.pooling.inputs, rows(chunk), strict=True):
            assert cosine(row, await alone(models.engines[BATCHED], item)) >= 0.999, item
        assert chunk.usage is not None and chunk.usage.completion_tokens == 0


async def test_the_next_batch_reaches_the_engine_while_one_computes(models: Models) -> None:
    """The model is decoupled: Triton's one instance takes the next batch as soon as it has handed one
    over, so a batch formed while the one before computes reaches the engine at once (which queues it
    for its process) instead of waiting in Triton's queue."""
    slow = models.engines[SLOW]
    assert isinstance(slow, SlowEngine)

    async def sent_after(delay_s: float, word: str) -> Chunk:
        await asyncio.sleep(delay_s)  # a turn of its own: a Triton request of its own
        return await answer(models.clients[SLOW], embed_job(SLOW, word))

    first = asyncio.ensure_future(sent_after(0.0, WORDS[0]))
    await slow.computing.wait()
    later = await asyncio.gather(*(sent_after(0.02 * i, word) for i, word in enumerate(WORDS[1:4])))
    assert len((await first).pooled) == 1 and all(len(chunk.pooled) == 1 for chunk in later)
    for word, chunk in zip(WORDS[:4], [await first, *later], strict=True):
        assert cosine(rows(chunk)[0], await alone(models.engines[BATCHED], word)) >= 0.999
    assert slow.most_at_once >= 2
    assert sum(slow.rows_per_call) == 4


async def test_a_deadline_that_passes_while_the_batch_computes_ends_that_job_only(models: Models) -> None:
    """The job's time left is kept by the client: its answer, when it comes later on the model's
    stream, is dropped, and the stream goes on answering the next jobs."""
    late = await answer(models.clients[SLOW], embed_job(SLOW, WORDS[0], deadline_s=0.1))  # held 0.3 s
    assert late.error is not None and late.error.code == "timeout"
    await asyncio.sleep(0.4)  # its answer comes back meanwhile, to nobody
    chunk = await answer(models.clients[SLOW], embed_job(SLOW, WORDS[1]))
    assert cosine(rows(chunk)[0], await alone(models.engines[BATCHED], WORDS[1])) >= 0.999


async def test_with_batching_off_each_request_runs_alone(models: Models) -> None:
    rng = random.Random(11)
    jobs = [embed_job(ALONE, text(rng)) for _ in range(32)]
    calls_before, rows_before, _ = batches(ALONE)
    await asyncio.gather(*(answer(models.clients[ALONE], job) for job in jobs))
    calls, total, _ = batches(ALONE)
    assert (calls - calls_before, total - rows_before) == (32, 32)


async def test_a_job_larger_than_a_batch_goes_in_parts_and_comes_back_in_order(models: Models) -> None:
    inputs = [f"input number {n} " + "word " * n for n in range(20)]
    calls_before, _, _ = batches(SMALL)
    chunk = await answer(models.clients[SMALL], embed_job(SMALL, *inputs))
    calls, _, _ = batches(SMALL)
    assert calls - calls_before >= 3  # 20 rows, 8 per request at most
    for item, row in zip(inputs, rows(chunk), strict=True):
        assert cosine(row, await alone(models.engines[SMALL], item)) >= 0.999


async def test_a_refused_input_fails_its_own_job_only(models: Models) -> None:
    client = models.clients[BATCHED]
    too_long = embed_job(BATCHED, "fine", "word " * 600)
    fine = [embed_job(BATCHED, f"fine text {n}") for n in range(8)]
    answers = await asyncio.gather(answer(client, too_long), *(answer(client, job) for job in fine))
    refused = answers[0].error
    assert refused is not None and refused.code == "invalid_request"
    assert refused.client_code == "context_length_exceeded" and refused.param == "input"
    assert refused.message.startswith("`input[1]`: This model's maximum context length is 512 tokens")
    assert all(chunk.error is None and len(chunk.pooled) == 1 for chunk in answers[1:])


async def test_a_job_past_its_deadline_is_answered_with_a_timeout(models: Models) -> None:
    chunk = await answer(models.clients[BATCHED], embed_job(BATCHED, "late", deadline_s=-1))
    assert chunk.error is not None and chunk.error.code == "timeout"


async def test_an_engine_that_fails_fails_the_jobs_of_its_batch(models: Models) -> None:
    with pytest.raises(TritonStreamError, match="the engine broke"):
        await answer(models.clients[FAILING], embed_job(FAILING, "anything"))


async def test_the_batched_models_metrics_count_requests_and_tokens(models: Models) -> None:
    labels = {"model": BATCHED}
    assert (REGISTRY.get_sample_value("switchboard:pooling_requests_total", labels) or 0) > 0
    assert (REGISTRY.get_sample_value("switchboard:pooling_rows_total", labels) or 0) > 64
    assert (REGISTRY.get_sample_value("switchboard:pooling_input_tokens_total", labels) or 0) > 64
    assert (REGISTRY.get_sample_value("switchboard:pooling_batcher_wait_seconds_count", labels) or 0) > 0
