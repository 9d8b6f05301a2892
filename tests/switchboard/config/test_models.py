"""A model's kind picks its engine and endpoints; mismatched kind, engine and batching fail at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchboard.config import ConfigError, load_settings


def _load(tmp_path: Path, entry: str) -> object:
    path = tmp_path / "switchboard.toml"
    path.write_text(f'[[models]]\nname = "m"\npath = "/models/m"\n{entry}\n')
    return load_settings(path, environ={})


def test_pooling_kinds_run_on_the_torch_runner_with_the_batcher_on_by_default(tmp_path: Path) -> None:
    settings = _load(tmp_path, 'kind = "embed"\nmatryoshka_dimensions = [32, 64]')
    model = settings.models[0]  # type: ignore[attr-defined]
    assert (model.kind, model.engine, model.engine_name, model.pooling) == ("embed", None, "torch", True)
    assert model.batching.enabled and 5 <= model.batching.queue_delay_ms <= 20
    assert max(model.batching.preferred_batch_sizes) <= model.batching.max_batch_size
    assert model.batching.instances == 2  # one batch gathered and handed over while one computes


def test_a_generator_stays_on_vllm(tmp_path: Path) -> None:
    model = _load(tmp_path, "").models[0]  # type: ignore[attr-defined]
    assert (model.kind, model.engine_name, model.pooling) == ("generate", "vllm", False)


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ('kind = "embed"\nengine = "vllm"', "a 'embed' model runs on engine 'torch', not 'vllm'"),
        ('kind = "generate"\nengine = "torch"', "runs on engine 'vllm' or 'trtllm', not 'torch'"),
        ('kind = "score"\nbatching = { max_batch_size = 8, preferred_batch_sizes = [4, 16] }', "[16] exceed"),
        ('kind = "classify"\nmatryoshka_dimensions = [8]', "matryoshka_dimensions is for embedders only"),
        ('kind = "rerank"', "kind"),
        ('kind = "embed"\nbatching = { instances = 0 }', "instances"),
    ],
)
def test_mismatches_fail_at_start_saying_what_to_change(tmp_path: Path, entry: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, entry)
    assert says in str(caught.value)


def _load_path(tmp_path: Path, path: str, entry: str = "") -> object:
    file = tmp_path / "switchboard.toml"
    file.write_text(f'[[models]]\nname = "m"\npath = "{path}"\n{entry}\n')
    return load_settings(file, environ={})


def test_models_in_a_bucket_and_on_the_hub_take_their_store_in_a_storage_table(tmp_path: Path) -> None:
    entry = '[models.storage]\nendpoint_url = "http://minio:9000"\nregion = "eu-west-1"\nprofile = "models"'
    model = _load_path(tmp_path, "s3://team-models/llama", entry).models[0]  # type: ignore[attr-defined]
    assert (model.storage.endpoint_url, model.storage.region, model.storage.profile) == (
        "http://minio:9000", "eu-west-1", "models",
    )  # fmt: skip
    hub = _load_path(tmp_path, "hf://org/name@v1", '[models.storage]\nendpoint_url = "http://mirror"')
    assert hub.models[0].storage.endpoint_url == "http://mirror"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("path", "entry", "says"),
    [
        ("s3://", "", "model 'm': path 's3://' names no bucket"),
        ("gs://bucket/llama", "", "not gs://"),
        ("hf://llama", "", "hf://org/name"),
        ("/models/m", '[models.storage]\nregion = "eu-west-1"', "storage is for a path in a store"),
        ("hf://org/name", '[models.storage]\nprofile = "p"', "the Hub takes storage.endpoint_url"),
        (
            "hf://org/name@main",
            '[models.storage]\nregion = "eu-west-1"',
            "storage.region and storage.profile",
        ),
        (
            "s3://Team_Models/llama",
            "",
            "model 'm': path 's3://Team_Models/llama': 'Team_Models' is not a bucket",
        ),
        ("hf://org/name@", "", "model 'm': path 'hf://org/name@': the revision after '@' is empty"),
        (
            "models/m",
            '[models.storage]\nendpoint_url = "http://minio:9000"',
            "not the local folder 'models/m'",
        ),
    ],
)
def test_a_wrong_path_or_storage_fails_at_start(tmp_path: Path, path: str, entry: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load_path(tmp_path, path, entry)
    assert says in str(caught.value)


def test_a_store_path_without_a_storage_table_reads_the_environment(tmp_path: Path) -> None:
    for path in ("s3://team-models", "s3://team-models/org/llama/", "hf://org/name@refs/pr/1"):
        model = _load_path(tmp_path, path).models[0]  # type: ignore[attr-defined]
        assert model.storage is None and model.path == path
