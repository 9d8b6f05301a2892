"""A worker's model files (workers/models/files.py) against a real S3 API (moto's server on loopback):
a load whose room in the node cache is held by a model in use waits for it to leave instead of
failing at once; a budget too small for the model alone fails at once."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from switchboard.config import ModelConfig, StorageConfig, WorkerConfig
from switchboard.sources.node_cache import CacheFull
from tests.support.s3_store import S3Store
from workers.models import files as files_module
from workers.models.files import FetchFailed, ModelFiles

MODEL_BYTES = 1024 * 1024


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Store]:
    folder = tmp_path_factory.mktemp("model")
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(os.urandom(MODEL_BYTES))
    with S3Store() as s3:
        s3.create_bucket("models")
        for prefix in ("a", "b"):
            s3.upload_folder(folder, "models", prefix)
        yield s3


@pytest.fixture
def models(store: S3Store, monkeypatch: pytest.MonkeyPatch) -> list[ModelConfig]:
    for name, value in store.env().items():
        monkeypatch.setenv(name, value)
    storage = StorageConfig(endpoint_url=store.endpoint_url)
    return [ModelConfig(name=name, path=f"s3://models/{name}", storage=storage) for name in ("a", "b")]


def worker_files(tmp_path: Path, models: list[ModelConfig], budget_bytes: float) -> ModelFiles:
    settings = WorkerConfig(model_cache_dir=str(tmp_path / "cache"), model_cache_gib=budget_bytes / 1024**3)
    return ModelFiles(settings, models)


async def test_a_load_waits_for_room_a_model_in_use_holds(
    tmp_path: Path, models: list[ModelConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files_module, "HELD_ROOM_POLL_S", 0.05)
    files = worker_files(tmp_path, models, budget_bytes=1.5 * MODEL_BYTES)
    held_a = await files.hold(models[0])
    started = time.monotonic()
    loading_b = asyncio.create_task(files.hold(models[1]))
    await asyncio.sleep(0.5)
    assert not loading_b.done(), "b waits while a is held"
    held_a.release()  # a's model leaves this host's worker
    held_b = await asyncio.wait_for(loading_b, timeout=10)
    assert time.monotonic() - started >= 0.5
    weights = Path(held_b.model.path, "model.safetensors")
    assert len(await asyncio.to_thread(weights.read_bytes)) == MODEL_BYTES
    assert files.cached() == ("b",)
    held_b.release()


async def test_a_budget_too_small_for_the_model_fails_at_once(
    tmp_path: Path, models: list[ModelConfig]
) -> None:
    files = worker_files(tmp_path, models, budget_bytes=0.5 * MODEL_BYTES)
    started = time.monotonic()
    with pytest.raises(FetchFailed) as failed:
        await files.hold(models[0])
    assert isinstance(failed.value.__cause__, CacheFull)
    assert "model_cache_gib" in str(failed.value)
    assert time.monotonic() - started < 5, "nothing held: no room will come by waiting"
