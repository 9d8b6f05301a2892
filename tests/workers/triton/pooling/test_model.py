"""A pooling model's batched Triton model against a real Triton host and the demo embedder.

Triton's dynamic batcher groups concurrent jobs into one engine call (seen in the batch-size
metric), and each job still gets exactly its own rows back; with batching off each request runs
alone; a job larger than a batch goes in parts and comes back whole, in order; a refused input
fails its own job only; a job whose deadline passes is answered with a timeout, and the model's
stream goes on; the requests that arrive while a batch computes run together as the next batch; a
model process that dies fails its batch's requests (the consumer answers their jobs with an engine
error) and its replacement answers the next ones. Served on the worker's own backend, a pooling
model has no shared memory region that another local user could open, not even while it loads; on
Triton's Python backend (where that backend is not built), stubs that die are started again.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import psutil
import pytest
import pytest_asyncio

from switchboard.config import BatchingConfig, ModelConfig, triton_model_name
from switchboard.local.demo_pooling_models import build_demo_embedder
from switchboard.metrics import REGISTRY
from switchboard.wire import Chunk, Job, chunk_decoder, encode
from tests.support.pooling_jobs import cosine, embed_job, rows
from tests.support.waits import eventually
from workers.engines.base import PooledRow, PoolingRow
from workers.engines.torch_pooling import TorchPoolingEngine
from workers.triton.generator.model import CoalescingPolicy
from workers.triton.host import TritonHost
from workers.triton.pooling.client import PoolingJobClient
from workers.triton.request_stream import TritonStreamError

pytestmark = pytest.mark.asyncio(loop_scope="module")

BATCHED, ALONE, SMALL, QUICK, MORTAL = "batched", "alone", "small", "quick", "mortal"
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "routers", "send", "requests")
# A batch the demo embedder takes a while over (about 0.7 s on one core): 64 rows of 250 words.
LONG_BATCH = tuple(" ".join(["word"] * 250) for _ in range(64))


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
        # A narrow window: requests a few milliseconds apart meet only while a batch computes.
        ModelConfig(name=QUICK, path=folder, kind="embed", batching=BatchingConfig(queue_delay_ms=1.0)),
        ModelConfig(name=MORTAL, path=folder, kind="embed"),
    ]
    host = TritonHost(coalescing=CoalescingPolicy(min_window_s=0.0, max_window_s=0.0, max_chunks_per_s=1e6))
    await asyncio.to_thread(host.start)
    engines = {config.name: TorchPoolingEngine(config) for config in configs}
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
            model=name,
            on_stub_lost=functools.partial(host.load_again_after_stub_loss, name),
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


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def python_backend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Models]:
    """One pooling model on Triton's Python backend, as where the worker's own is not built."""
    folder = str(build_demo_embedder(tmp_path_factory.mktemp("embedder") / "model"))
    host = TritonHost(
        coalescing=CoalescingPolicy(min_window_s=0.0, max_window_s=0.0, max_chunks_per_s=1e6), native=False
    )
    await asyncio.to_thread(host.start)
    engine = TorchPoolingEngine(ModelConfig(name=MORTAL, path=folder, kind="embed"))
    await asyncio.gather(engine.start(), asyncio.to_thread(host.bind, MORTAL, engine))
    client = PoolingJobClient(
        host.grpc_address,
        triton_model_name(MORTAL),
        max_batch_size=engine.model.batching.max_batch_size,
        model=f"{MORTAL}-python",
        on_stub_lost=functools.partial(host.load_again_after_stub_loss, MORTAL),
    )
    try:
        yield Models(host, {MORTAL: engine}, {MORTAL: client})
    finally:
        await client.close()
        await engine.stop()
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


async def test_requests_that_arrive_while_a_batch_computes_run_together_next(models: Models) -> None:
    """Two instances, not decoupled: while a long batch computes on one, the first of the requests
    sent one by one (each a Triton request of its own, further apart than the 1 ms window) leaves
    alone on the other, to wait for the model's process there; the rest wait in Triton's queue, both
    instances busy, and leave together once the long batch is done. (Now and then Triton's batcher
    closes a batch of the next one alone when its window passes, and the rest follow as one more:
    alone, six would be six batches.)"""
    calls_before, rows_before, _ = batches(QUICK)
    long = asyncio.ensure_future(answer(models.clients[QUICK], embed_job(QUICK, *LONG_BATCH)))

    async def sent_after(delay_s: float, word: str) -> Chunk:
        await asyncio.sleep(delay_s)
        return await answer(models.clients[QUICK], embed_job(QUICK, word))

    await asyncio.sleep(0.2)  # the long batch has left the batcher and computes (for about 0.7 s)
    later = await asyncio.gather(*(sent_after(0.01 * i, word) for i, word in enumerate(WORDS[:6])))
    assert len((await long).pooled) == len(LONG_BATCH)
    calls, total, _ = batches(QUICK)
    assert total - rows_before == len(LONG_BATCH) + 6
    assert calls - calls_before in (3, 4)
    for word, chunk in zip(WORDS[:6], later, strict=True):
        assert cosine(rows(chunk)[0], await alone(models.engines[BATCHED], word)) >= 0.999


async def test_a_deadline_that_passes_while_the_batch_computes_ends_that_job_only(models: Models) -> None:
    """The job's time left is kept by the client: its answer, when it comes later on the model's
    stream, is dropped, and the stream goes on answering the next jobs."""
    long = asyncio.ensure_future(answer(models.clients[QUICK], embed_job(QUICK, *LONG_BATCH)))
    await asyncio.sleep(0.2)
    late = await answer(models.clients[QUICK], embed_job(QUICK, WORDS[0], deadline_s=0.05))
    assert late.error is not None and late.error.code == "timeout"
    await long  # the late job's answer came back meanwhile, to nobody
    chunk = await answer(models.clients[QUICK], embed_job(QUICK, WORDS[1]))
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


async def test_a_model_process_that_dies_fails_its_batch_and_its_replacement_answers_next(
    models: Models,
) -> None:
    engine = models.engines[MORTAL]
    killed = engine.pid
    assert killed is not None
    long = asyncio.ensure_future(answer(models.clients[MORTAL], embed_job(MORTAL, *LONG_BATCH)))
    await asyncio.sleep(0.1)
    os.kill(killed, signal.SIGKILL)
    with pytest.raises(TritonStreamError, match="ended during the batch"):
        await long
    chunk = await answer(models.clients[MORTAL], embed_job(MORTAL, WORDS[2]))
    assert cosine(rows(chunk)[0], await alone(models.engines[BATCHED], WORDS[2])) >= 0.999
    assert engine.pid not in (None, killed)


async def test_no_region_of_the_worker_is_ever_readable_by_others_while_a_model_loads_and_serves(
    models: Models, tmp_path: Path
) -> None:
    """Another local user that opens a region while it is readable keeps reading every later batch of
    the model through it: a process looking at /dev/shm as fast as it can never sees a region of this
    worker's, open or not, while a pooling model is loaded, serves concurrent jobs and is unloaded.
    (Through Triton's Python backend each stub made one, open to others for 2 to 10 ms before the
    worker closed it.)"""
    assert models.host.native, "the worker's own backend is built for the tests (`make install`)"
    assert models.host._shm is not None
    prefix = models.host._shm.prefix
    looker = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).with_name("open_regions.py")),
        prefix,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert looker.stdout is not None
    try:
        assert await looker.stdout.readline() == b"polling\n"
        # It does see an open region of this Triton's: this one, made open on purpose.
        control = Path("/dev/shm") / f"{prefix}-control"
        control.write_bytes(b"")
        control.chmod(0o644)
        assert await looker.stdout.readline() == f"new {control.name} 644\n".encode()
        assert await looker.stdout.readline() == f"open {control.name} 644\n".encode()
        control.unlink()
        await _load_and_serve(models.host, models.engines[BATCHED].model.path, "watched")
    finally:
        seen, _ = await looker.communicate(b"")
    lines = seen.decode().splitlines()
    assert lines[-1].startswith("polls ") and int(lines[-1].split()[1]) > 100, lines[-1]
    assert lines[:-1] == [], f"regions of the worker's (readable by others when made): {lines[:-1]}"


async def _load_and_serve(host: TritonHost, model_path: str, name: str) -> None:
    """Load a pooling model, answer concurrent jobs with it, unload it."""
    engine = TorchPoolingEngine(ModelConfig(name=name, path=model_path, kind="embed"))
    await asyncio.gather(engine.start(), asyncio.to_thread(host.bind, name, engine))
    client = PoolingJobClient(host.grpc_address, triton_model_name(name), max_batch_size=64, model=name)
    try:
        answers = await asyncio.gather(*(answer(client, embed_job(name, f"query {n}")) for n in range(16)))
        assert all(chunk.error is None and len(chunk.pooled) == 1 for chunk in answers)
    finally:
        await client.close()
        host.unbind(name)
        await engine.stop()


async def test_stubs_that_die_fail_their_batch_and_triton_starts_them_again(python_backend: Models) -> None:
    """Triton's Python stubs of a pooling model killed (out of memory, say) while a batch computes:
    the batch fails with an error, never hangs. Triton does not start them again by itself (it calls
    them unhealthy); the client's first such answer loads the model into Triton again, and the new
    stubs connect to the model's process anew and answer the next jobs."""
    models = python_backend
    client = models.clients[MORTAL]
    long = asyncio.ensure_future(answer(client, embed_job(MORTAL, *LONG_BATCH)))
    await asyncio.sleep(0.1)
    stubs = _stubs_of(triton_model_name(MORTAL))
    assert len(stubs) == models.engines[MORTAL].model.batching.instances
    for stub in stubs:
        stub.kill()
    with pytest.raises(TritonStreamError):
        await asyncio.wait_for(long, 30)

    async def answers_again() -> bool:
        try:
            chunk = await asyncio.wait_for(answer(client, embed_job(MORTAL, WORDS[3])), 10)
        except (TritonStreamError, TimeoutError):
            return False
        return cosine(rows(chunk)[0], await alone(models.engines[MORTAL], WORDS[3])) >= 0.999

    await eventually(answers_again, timeout_s=60, what="an answer through the stubs started again")
    assert not {stub.pid for stub in stubs} & {stub.pid for stub in _stubs_of(triton_model_name(MORTAL))}


def _stubs_of(triton_model: str) -> list[psutil.Process]:
    """The model's live Python stubs, one per instance (Triton names them `<model>_0_<instance>`)."""
    stubs = []
    for process in psutil.Process().children(recursive=True):
        try:
            command = process.cmdline()
        except psutil.Error:
            continue  # ended, or killed and not yet reaped
        if "triton_python_backend_stub" in " ".join(command) and any(
            part.startswith(f"{triton_model}_0_") for part in command
        ):
            stubs.append(process)
    return stubs


async def test_the_batched_models_metrics_count_requests_and_tokens(models: Models) -> None:
    labels = {"model": BATCHED}
    assert (REGISTRY.get_sample_value("switchboard:pooling_requests_total", labels) or 0) > 0
    assert (REGISTRY.get_sample_value("switchboard:pooling_rows_total", labels) or 0) > 64
    assert (REGISTRY.get_sample_value("switchboard:pooling_input_tokens_total", labels) or 0) > 64
    assert (REGISTRY.get_sample_value("switchboard:pooling_batcher_wait_seconds_count", labels) or 0) > 0
