"""Tests for the offline demo pooling models' builder (no vLLM needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from switchboard.config import ModelConfig
from switchboard.local.demo_pooling_models import (
    CLASSIFIER_LABELS,
    MARKER_NAME,
    MAX_POSITIONS,
    build_demo_classifier,
    build_demo_embedder,
    build_demo_reranker,
    is_complete,
    pooling_config_entry,
)

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
msgspec = pytest.importorskip("msgspec")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pooling")
    return {
        "embed": build_demo_embedder(root / "embed"),
        "classify": build_demo_classifier(root / "classify"),
        "score": build_demo_reranker(root / "rerank"),
    }


def test_folders_are_complete_and_clean(folders: dict[str, Path]) -> None:
    for kind, folder in folders.items():
        assert is_complete(folder, kind)  # type: ignore[arg-type]
        assert {"config.json", "model.safetensors", "tokenizer.json", MARKER_NAME} <= {
            p.name for p in folder.iterdir()
        }
    # The scratch folders were renamed into place, not left beside them.
    assert sorted(p.name for p in folders["embed"].parent.iterdir()) == ["classify", "embed", "rerank"]


def test_a_folder_of_one_kind_is_not_taken_for_another(folders: dict[str, Path]) -> None:
    assert not is_complete(folders["embed"], "classify")
    assert not is_complete(folders["classify"], "score")


def test_building_again_reuses_the_folder(folders: dict[str, Path]) -> None:
    weights = folders["embed"] / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert build_demo_embedder(folders["embed"]) == folders["embed"]
    assert weights.stat().st_mtime_ns == before


def test_a_folder_of_another_kind_is_rebuilt(tmp_path: Path) -> None:
    folder = build_demo_classifier(tmp_path / "model")
    build_demo_embedder(folder)
    assert is_complete(folder, "embed")
    assert transformers.AutoConfig.from_pretrained(folder).architectures == ["BertModel"]


def test_embedder_declares_mean_pooling(folders: dict[str, Path]) -> None:
    folder = folders["embed"]
    config = transformers.AutoConfig.from_pretrained(folder)
    assert config.model_type == "bert"
    assert config.architectures == ["BertModel"]
    assert config.hidden_size == 128
    assert config.max_position_embeddings == MAX_POSITIONS
    modules = json.loads((folder / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] is True
    assert pooling["word_embedding_dimension"] == 128


def test_classifier_and_reranker_labels(folders: dict[str, Path]) -> None:
    classifier = transformers.AutoConfig.from_pretrained(folders["classify"])
    assert classifier.architectures == ["BertForSequenceClassification"]
    assert [classifier.id2label[i] for i in range(3)] == list(CLASSIFIER_LABELS)
    reranker = transformers.AutoConfig.from_pretrained(folders["score"])
    assert reranker.num_labels == 1


def test_tokenizer_templates_one_text_and_pairs(folders: dict[str, Path]) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders["score"])
    single = tokenizer("Hello there")
    ids = single["input_ids"]
    assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
    assert tokenizer.unk_token_id not in ids
    pair = tokenizer("what is a fox", "The quick brown fox.")
    types = pair["token_type_ids"]
    assert pair["input_ids"].count(tokenizer.sep_token_id) == 2
    assert types[0] == 0 and types[-1] == 1 and set(types) == {0, 1}
    assert tokenizer.model_max_length == MAX_POSITIONS


def test_models_answer_differently_for_different_texts(folders: dict[str, Path]) -> None:
    """Random weights at BERT's usual scale answer every text alike; ours must not, or tests could
    not tell one row from another."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders["embed"])
    texts = ["The quick brown fox.", "Hello! How are you today?"]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = transformers.AutoModel.from_pretrained(folders["embed"])(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    vectors = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    assert float(vectors[0] @ vectors[1]) < 0.97
    classifier = transformers.AutoModelForSequenceClassification.from_pretrained(folders["classify"])
    with torch.inference_mode():
        probabilities = classifier(**batch).logits.softmax(-1)
    assert float((probabilities[0] - probabilities[1]).abs().max()) > 0.01


def test_config_entries_make_valid_model_configs(folders: dict[str, Path]) -> None:
    for kind, folder in folders.items():
        entry = pooling_config_entry(folder, kind, preload=True)  # type: ignore[arg-type]
        model = msgspec.convert(entry, ModelConfig)
        assert model.kind == kind and model.pooling and model.engine_name == "torch"
        assert model.path == str(folder) and model.preload
    named = pooling_config_entry(
        folders["embed"], "embed", name="e5", batching={"max_batch_size": 8, "preferred_batch_sizes": [8]}
    )
    assert msgspec.convert(named, ModelConfig).batching.max_batch_size == 8
    assert named["name"] == "e5"
