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
