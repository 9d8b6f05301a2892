"""Tests for the offline demo model builder (no vLLM needed)."""

from __future__ import annotations

import hashlib
import string
from pathlib import Path

import pytest

from switchboard.local.demo_model import MARKER_NAME, build_demo_model, is_complete

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("demo") / "model")


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):
    return transformers.AutoTokenizer.from_pretrained(model_dir)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_folder_is_complete_and_clean(model_dir: Path) -> None:
    assert is_complete(model_dir)
    names = {p.name for p in model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", MARKER_NAME} <= names
    # The scratch folder was renamed into place, not left beside it.
    assert [p.name for p in model_dir.parent.iterdir()] == [model_dir.name]


def test_config_loads(model_dir: Path, tokenizer) -> None:
    config = transformers.AutoConfig.from_pretrained(model_dir)
    assert config.model_type == "llama"
    assert config.hidden_size // config.num_attention_heads == 64
    assert config.num_key_value_heads == 2
    assert config.tie_word_embeddings is False
    assert config.vocab_size == len(tokenizer)
    assert 300 <= config.vocab_size <= 512
    assert config.eos_token_id == tokenizer.eos_token_id
    assert config.bos_token_id == tokenizer.bos_token_id
    generation = transformers.GenerationConfig.from_pretrained(model_dir)
    assert generation.eos_token_id == tokenizer.eos_token_id


def test_every_token_decodes_to_printable_ascii(tokenizer) -> None:
    special = set(tokenizer.all_special_ids)
    for token_id in range(len(tokenizer)):
        if token_id in special:
            continue
        text = tokenizer.decode([token_id])
        assert text, token_id
        assert all(c in string.printable for c in text), (token_id, text)


def test_ascii_text_round_trips(tokenizer) -> None:
    text = 'Hello, world! Is 42 > 7? {"x": [1, 2]} ~\n\tthe end_'
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text


def test_chat_template_renders(tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
    ]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == "<s><|system|>\nBe brief.\n<|user|>\nHi there\n<|assistant|>\n"


def test_greedy_generation_runs_long(model_dir: Path, tokenizer) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Tell me a story."}],
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=48, do_sample=False)
    new = out[0, ids.shape[1] :].tolist()
    # The EOS row of lm_head is muted, so the reply runs to max_new_tokens.
    assert len(new) == 48
    assert not set(new) & set(tokenizer.all_special_ids)


def test_second_build_is_a_no_op(model_dir: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()}
    steps: list[str] = []
    assert build_demo_model(model_dir, progress=steps.append) == model_dir
    assert steps == []
    assert {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()} == before


def test_builds_are_identical(model_dir: Path, tmp_path: Path) -> None:
    steps: list[str] = []
    other = build_demo_model(tmp_path / "other", progress=steps.append)
    assert "training tokenizer" in steps and "saving" in steps
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert _sha256(other / name) == _sha256(model_dir / name), name


def test_incomplete_folder_is_replaced(tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text("{}")  # A crash left this without a marker.
    build_demo_model(target)
    assert is_complete(target)
    assert transformers.AutoConfig.from_pretrained(target).model_type == "llama"
