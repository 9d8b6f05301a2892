"""The PyTorch pooling runner against plain transformers, on the demo embedder, classifier and reranker.

Each row's answer is what transformers computes for that input alone (padding and batch mates change
nothing); `dimensions`, truncation and token-id inputs mean what they mean in vLLM; what the model
cannot take is refused row by row, with OpenAI's codes.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psutil
import pytest
import pytest_asyncio

from switchboard.config import ModelConfig
from switchboard.local.demo_pooling_models import (
    CLASSIFIER_LABELS,
    PoolingKind,
    build_demo_classifier,
    build_demo_embedder,
    build_demo_reranker,
)
from switchboard.wire import ModelLimits
from tests.support.waits import eventually
from workers.engines.base import InvalidEngineRequest, PooledRow, PoolingRow
from workers.engines.prompts import longest_token_chars
from workers.engines.registry import EngineOptions, create_engine
from workers.engines.torch_pooling.engine import TorchPoolingEngine
from workers.engines.torch_pooling.inputs import RowEncoder
from workers.engines.torch_pooling.process import PoolingProcessFailed
from workers.engines.torch_pooling.runner import TOKEN_BUDGET, sub_batches

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.asyncio(loop_scope="module")

Vector = npt.NDArray[np.float32]
TEXTS = ["Hello there!", "The quick brown fox jumps over the lazy dog.", "a " * 200, "x"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pooling-models")
    return {
        "embed": build_demo_embedder(root / "embed"),
        "classify": build_demo_classifier(root / "classify"),
        "score": build_demo_reranker(root / "score"),
    }


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def engines(folders: dict[str, Path]) -> AsyncIterator[dict[str, TorchPoolingEngine]]:
    kinds: tuple[PoolingKind, ...] = ("embed", "classify", "score")
    started: dict[str, TorchPoolingEngine] = {
        kind: TorchPoolingEngine(ModelConfig(name=kind, path=str(folders[kind]), kind=kind)) for kind in kinds
    }
    for engine in started.values():
        await engine.start()
    yield started
    for engine in started.values():
        await engine.stop()


@pytest.fixture(scope="module")
def tokenizer(folders: dict[str, Path]) -> Any:
    return transformers.AutoTokenizer.from_pretrained(folders["embed"])


@pytest.fixture(scope="module")
def reference(folders: dict[str, Path]) -> dict[str, Any]:
    """The models as plain transformers loads them."""
    return {
        "embed": transformers.AutoModel.from_pretrained(folders["embed"]).eval(),
        "classify": transformers.AutoModelForSequenceClassification.from_pretrained(
            folders["classify"]
        ).eval(),
        "score": transformers.AutoModelForSequenceClassification.from_pretrained(folders["score"]).eval(),
    }


def mean_pooled(model: Any, ids: list[int]) -> Vector:
    """Transformers' last hidden states of one unpadded input, averaged."""
    with torch.inference_mode():
        hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
    return np.asarray(hidden.mean(dim=0).numpy(), dtype=np.float32)


def unit(vector: Vector) -> Vector:
    return vector / np.linalg.norm(vector)


async def pooled(engine: TorchPoolingEngine, *rows: PoolingRow) -> list[Vector]:
    answers = await engine.pool(rows)
    assert all(isinstance(answer, PooledRow) for answer in answers), answers
    return [np.frombuffer(answer.values, dtype="<f4") for answer in answers if isinstance(answer, PooledRow)]


def embed(item: str | tuple[int, ...], **options: Any) -> PoolingRow:
    return PoolingRow(task="embed", input=item, **options)


async def test_embeddings_are_transformers_mean_pooled_and_normalized(
    engines: dict[str, TorchPoolingEngine], reference: dict[str, Any], tokenizer: Any
) -> None:
    rows = await pooled(engines["embed"], *(embed(text) for text in TEXTS))
    for text, row in zip(TEXTS, rows, strict=True):
        expected = unit(mean_pooled(reference["embed"], tokenizer(text)["input_ids"]))
        np.testing.assert_allclose(row, expected, atol=2e-5)
        assert abs(float(np.linalg.norm(row)) - 1.0) < 1e-5


async def test_padding_and_batch_mates_change_no_row(engines: dict[str, TorchPoolingEngine]) -> None:
    engine = engines["embed"]
    (alone,) = await pooled(engine, embed("short one"))
    together = await pooled(
        engine, embed("a much longer text " * 20), embed("short one"), embed("mid length text")
    )
    np.testing.assert_allclose(together[1], alone, atol=1e-5)


async def test_rows_encoded_together_are_each_what_it_is_alone(folders: dict[str, Path]) -> None:
    """One tokenizer call for a batch's plain texts: every row's ids, or its refusal, as alone."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders["embed"])
    tokenizer.model_max_length = 2**31 - 1
    limits = ModelLimits(max_model_len=512, vocab_size=400, max_token_chars=longest_token_chars(tokenizer))
    encoder = RowEncoder(tokenizer, model_name="embed", limits=limits)
    rows = [
        embed("Hello there!"),
        embed("a " * 600),  # past the context: refused
        PoolingRow(task="embed", input=(5, 6, 7)),
        PoolingRow(task="embed", input="a " * 600, truncate_prompt_tokens=8),
        PoolingRow(task="embed", input=(5, 999)),  # outside the vocabulary: refused
        embed("The quick brown fox jumps over the lazy dog."),
    ]
    alone: list[Any] = []
    for row in rows:
        try:
            alone.append(encoder.encode(row))
        except InvalidEngineRequest as refusal:
            alone.append(refusal)
    together = encoder.encode_all(rows)
    assert len(together) == len(rows)
    for one, other in zip(alone, together, strict=True):
        if isinstance(one, InvalidEngineRequest):
            assert isinstance(other, InvalidEngineRequest) and (str(other), other.code) == (
                str(one),
                one.code,
            )
        else:
            assert other == one
    assert [isinstance(row, InvalidEngineRequest) for row in together] == [
        False,
        True,
        False,
        False,
        True,
        False,
    ]


async def test_dimensions_cut_and_renormalize(
    engines: dict[str, TorchPoolingEngine], reference: dict[str, Any], tokenizer: Any
) -> None:
    full = mean_pooled(reference["embed"], tokenizer("cut me short")["input_ids"])
    cut, raw = await pooled(
        engines["embed"], embed("cut me short", dimensions=16), embed("cut me short", normalize=False)
    )
    assert cut.shape == (16,)
    np.testing.assert_allclose(cut, unit(full[:16]), atol=2e-5)
    np.testing.assert_allclose(raw, full, atol=2e-5)


async def test_truncation_keeps_the_last_tokens(
    engines: dict[str, TorchPoolingEngine], reference: dict[str, Any], tokenizer: Any
) -> None:
    text = "first words are dropped and the last ones are kept " * 40
    ids = tokenizer(text)["input_ids"]
    assert len(ids) > 512
    kept = [ids[0], *ids[-9:-1], ids[-1]]  # [CLS], the last 8 tokens of the text, [SEP]
    rows = [
        embed(text, truncate_prompt_tokens=10),
        embed(text, truncate_prompt_tokens=-1),
        embed(tuple(ids), truncate_prompt_tokens=5),
    ]
    answers = await engines["embed"].pool(rows)
    assert [a.prompt_tokens for a in answers if isinstance(a, PooledRow)] == [10, 512, 5]
    ten, longest, given = (np.frombuffer(a.values, dtype="<f4") for a in answers if isinstance(a, PooledRow))
    np.testing.assert_allclose(ten, unit(mean_pooled(reference["embed"], kept)), atol=2e-5)
    np.testing.assert_allclose(given, unit(mean_pooled(reference["embed"], ids[-5:])), atol=2e-5)
    assert longest.shape == (128,)


async def test_token_ids_are_used_as_given(engines: dict[str, TorchPoolingEngine], tokenizer: Any) -> None:
    ids = tuple(tokenizer("given as token ids")["input_ids"])
    from_text, from_ids = await pooled(engines["embed"], embed("given as token ids"), embed(ids))
    np.testing.assert_allclose(from_ids, from_text, atol=1e-6)


async def test_what_the_model_cannot_take_is_refused_row_by_row(
    engines: dict[str, TorchPoolingEngine],
) -> None:
    answers = await engines["embed"].pool(
        [
            embed((5, 400, 7)),
            embed("fine"),
            embed("word " * 600),
            embed(tuple(range(300)) * 2),
            embed("x", truncate_prompt_tokens=513),
        ]
    )
    outside, fine, text_too_long, ids_too_long, bad_truncation = answers
    assert isinstance(outside, InvalidEngineRequest)
    assert (outside.param, outside.code) == ("input", "invalid_value")
    assert "[400]" in str(outside) and "400 tokens" in str(outside)
    assert isinstance(fine, PooledRow)
    for refused in (text_too_long, ids_too_long):
        assert isinstance(refused, InvalidEngineRequest)
        assert (refused.param, refused.code) == ("input", "context_length_exceeded")
        assert str(refused).startswith("This model's maximum context length is 512 tokens")
    assert (
        isinstance(bad_truncation, InvalidEngineRequest) and bad_truncation.param == "truncate_prompt_tokens"
    )


async def test_classifier_probabilities_and_labels(
    engines: dict[str, TorchPoolingEngine], reference: dict[str, Any], tokenizer: Any
) -> None:
    engine = engines["classify"]
    assert engine.labels() == CLASSIFIER_LABELS
    rows = await pooled(engine, *(PoolingRow(task="classify", input=text) for text in TEXTS))
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.inference_mode():
        expected = reference["classify"](**batch).logits.softmax(-1).numpy()
    np.testing.assert_allclose(np.stack(rows), expected, atol=2e-5)


async def test_reranker_scores_query_document_pairs(
    engines: dict[str, TorchPoolingEngine], reference: dict[str, Any], tokenizer: Any
) -> None:
    query, documents = "where is the fox", ["The quick brown fox.", "Paris is in France.", "a " * 50]
    answers = await engines["score"].pool([PoolingRow(task="score", input=d, query=query) for d in documents])
    batch = tokenizer([query] * 3, documents, padding=True, return_tensors="pt")
    with torch.inference_mode():
        expected = reference["score"](**batch).logits[:, 0].sigmoid().numpy()
    scores = [float(np.frombuffer(a.values, dtype="<f4")[0]) for a in answers if isinstance(a, PooledRow)]
    np.testing.assert_allclose(scores, expected, atol=2e-5)
    # The pair's tokens, the query's included, as the engine saw them.
    assert [a.prompt_tokens for a in answers if isinstance(a, PooledRow)] == [
        len(tokenizer(query, d)["input_ids"]) for d in documents
    ]


async def test_a_declared_cls_pooling_is_followed(
    folders: dict[str, Path], reference: dict[str, Any], tokenizer: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "cls"
    shutil.copytree(folders["embed"], folder)
    config = folder / "1_Pooling" / "config.json"
    declared = json.loads(config.read_text())
    config.write_text(
        json.dumps({**declared, "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True})
    )
    engine = TorchPoolingEngine(ModelConfig(name="cls", path=str(folder), kind="embed"))
    await engine.start()
    try:
        (row,) = await pooled(engine, embed("first token only"))
    finally:
        await engine.stop()
    with torch.inference_mode():
        hidden = reference["embed"](
            input_ids=torch.tensor([tokenizer("first token only")["input_ids"]])
        ).last_hidden_state
    np.testing.assert_allclose(row, unit(hidden[0, 0].numpy()), atol=2e-5)


async def test_limits_jobs_at_once_footprint_and_no_generation(
    engines: dict[str, TorchPoolingEngine], reference: dict[str, Any]
) -> None:
    engine = engines["embed"]
    limits = engine.limits()
    assert limits is not None and (limits.max_model_len, limits.vocab_size) == (512, 400)
    assert limits.max_token_chars >= 2
    # Published so that the front door refuses `dimensions` above it; a classifier has no such size.
    assert limits.embedding_size == reference["embed"].config.hidden_size
    classifier_limits = engines["classify"].limits()
    assert classifier_limits is not None and classifier_limits.embedding_size is None
    assert engine.max_sequences() == 2 * engine.model.batching.max_batch_size
    footprint = engine.footprint()
    assert footprint.device == "cpu"
    parameters = sum(p.numel() * 4 for p in reference["embed"].parameters())
    assert parameters < footprint.memory_bytes < parameters + 512 * 1024**2
    with pytest.raises(InvalidEngineRequest, match="pooling model"):
        engine.generate(None)  # type: ignore[arg-type]


async def test_the_registry_runs_the_pooling_kinds_on_torch(folders: dict[str, Path]) -> None:
    options = EngineOptions(cpu_threads="0", cpu_kvcache_gib=1.0, engine_process="fork")
    for kind in ("embed", "classify", "score"):
        engine = create_engine(ModelConfig(name=kind, path=str(folders[kind]), kind=kind), options)  # type: ignore[arg-type]
        assert isinstance(engine, TorchPoolingEngine)
        assert engine.footprint().memory_bytes > 0  # before start: from its files


async def test_sub_batches_group_similar_lengths_within_the_budget() -> None:
    lengths = [3, 4, 5, 6, 7, 8, 40, 41, 42, 500, 510]
    ranges = sub_batches(lengths, max_rows=4)
    assert [r for start, end in ranges for r in range(start, end)] == list(range(len(lengths)))
    assert ranges[0] == (0, 4)  # at most 4 rows
    for start, end in ranges:
        rows = lengths[start:end]
        assert len(rows) * max(rows) <= TOKEN_BUDGET
        assert max(rows) <= 2 * min(rows) + 16
    assert sub_batches([], max_rows=8) == []


# Three pooling models loading at once, in an interpreter that has not imported transformers yet.
LOADS_TOGETHER = """
import asyncio, sys
from switchboard.config import ModelConfig
from switchboard.wire import ModelLimits
from workers.engines.torch_pooling.engine import TorchPoolingEngine

async def main():
    kinds = ("embed", "classify", "score")
    engines = [TorchPoolingEngine(ModelConfig(name=k, path=p, kind=k)) for k, p in zip(kinds, sys.argv[1:])]
    await asyncio.gather(*(engine.start() for engine in engines))
    print("started", [engine.limits() is not None for engine in engines])

asyncio.run(main())
"""


async def test_models_loading_together_import_transformers_once(folders: dict[str, Path]) -> None:
    """transformers' lazy imports fail when two threads import the same class at once."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        LOADS_TOGETHER,
        *(str(folders[kind]) for kind in ("embed", "classify", "score")),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, output.decode()[-2000:]
    assert b"started [True, True, True]" in output


async def test_the_engine_computes_on_the_cores_it_was_placed_on(folders: dict[str, Path]) -> None:
    """The model's own process, and every thread it starts, compute on its cores; the calling
    process's threads stay where they were."""
    before = os.sched_getaffinity(0)
    core = min(before)
    engine = TorchPoolingEngine(
        ModelConfig(name="placed", path=str(folders["embed"]), kind="embed"), cpu_threads=f"{core}"
    )
    await engine.start()
    try:
        pid = engine.pid
        assert pid is not None and pid != os.getpid()
        placed = os.sched_getaffinity(pid)
        await pooled(engine, PoolingRow(task="embed", input="a few words to compute"))
        # Every thread it started computing, pinned as well.
        threads = [thread.id for thread in psutil.Process(pid).threads()]
        pinned = {tid: os.sched_getaffinity(tid) for tid in threads}
    finally:
        await engine.stop()
    assert placed == {core}
    assert all(cores == {core} for cores in pinned.values()), pinned
    assert os.sched_getaffinity(0) == before, "the caller's own threads stay put"
    assert not psutil.pid_exists(pid), "the model's process ends with the engine"


async def test_a_model_whose_process_cannot_start_again_says_it_has_ended(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    """The model's process died and the one started in its place failed (its files gone, say): the
    engine says why, so that the worker unloads the model rather than keep it warm failing every
    batch; a stop forgets it (a later start loads afresh)."""
    model_dir = tmp_path / "embedder"
    shutil.copytree(folders["embed"], model_dir)
    engine = TorchPoolingEngine(ModelConfig(name="orphan", path=str(model_dir), kind="embed"))
    await engine.start()
    try:
        assert engine.ended() is None
        shutil.rmtree(model_dir)
        killed = engine.pid
        assert killed is not None
        os.kill(killed, signal.SIGKILL)

        async def has_ended() -> bool:
            return engine.ended() is not None

        await eventually(has_ended, timeout_s=60, what="the engine saying its model has ended")
        assert "orphan ended and could not be started again" in str(engine.ended())
    finally:
        await engine.stop()
    assert engine.ended() is None


async def test_a_model_whose_process_dies_fails_that_batch_and_starts_again(folders: dict[str, Path]) -> None:
    """A killed model process fails the batch it was given with an error that says so, never hangs;
    the next batch finds it started again."""
    engine = TorchPoolingEngine(ModelConfig(name="doomed", path=str(folders["embed"]), kind="embed"))
    await engine.start()
    try:
        killed = engine.pid
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        with pytest.raises(PoolingProcessFailed, match="exited"):
            await asyncio.wait_for(engine.pool([PoolingRow(task="embed", input="anyone there?")]), 30)
        (again,) = await asyncio.wait_for(engine.pool([PoolingRow(task="embed", input="anyone there?")]), 60)
        assert isinstance(again, PooledRow)
        assert engine.pid not in (None, killed)
    finally:
        await engine.stop()
