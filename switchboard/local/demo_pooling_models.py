"""Tiny random-weight pooling models in Hugging Face format, built offline.

An embedder (`BertModel`, mean pooling, declared the sentence-transformers way), a classifier
(`BertForSequenceClassification`, labels "negative", "neutral", "positive") and a cross-encoder
reranker (the same with one label). Their answers mean nothing, but Transformers and vLLM's pooling
runner load them like real models, so demos, tests and benchmarks can run the pooling paths without
downloading anything. The folders follow `demo_model.py`'s scheme: built beside the target, renamed
into place, and reused while their marker names the current format.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from switchboard.local.demo_model import save_quietly, train_bpe

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

PoolingKind = Literal["embed", "classify", "score"]

# Bump when the files produced change, so old folders are rebuilt rather than reused.
FORMAT_VERSION = "1"
# The demo LLM's marker file; its text names the kind too, so a folder of one kind is never taken
# for another.
MARKER_NAME = ".switchboard-demo-model"

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = SPECIAL_TOKENS
MAX_POSITIONS = 512
HIDDEN_SIZE = 128
CLASSIFIER_LABELS = ("negative", "neutral", "positive")
SEED = 4321

# Default names of the demo pooling models in `[[models]]` entries.
DEMO_EMBEDDER_NAME = "switchboard-demo-embed"
DEMO_CLASSIFIER_NAME = "switchboard-demo-classify"
DEMO_RERANKER_NAME = "switchboard-demo-rerank"
DEMO_NAMES: dict[PoolingKind, str] = {
    "embed": DEMO_EMBEDDER_NAME,
    "classify": DEMO_CLASSIFIER_NAME,
    "score": DEMO_RERANKER_NAME,
}

# Random BERT weights at the usual scale (0.02) give every text nearly the same vector and every
# label nearly the same probability; a wider spread makes different inputs answer differently,
# which the tests need to tell rows apart.
INITIALIZER_RANGE = 0.2


def build_demo_embedder(target_dir: Path, *, progress: Callable[[str], None] | None = None) -> Path:
    """Build the demo embedder (mean pooling, normalized, 128 dimensions) into target_dir."""
    return _build(target_dir, "embed", progress)


def build_demo_classifier(target_dir: Path, *, progress: Callable[[str], None] | None = None) -> Path:
    """Build the demo classifier (3 labels: negative, neutral, positive) into target_dir."""
    return _build(target_dir, "classify", progress)


def build_demo_reranker(target_dir: Path, *, progress: Callable[[str], None] | None = None) -> Path:
    """Build the demo cross-encoder reranker (one relevance logit per query-document pair)."""
    return _build(target_dir, "score", progress)


def pooling_config_entry(
    path: Path, kind: PoolingKind, *, name: str | None = None, **fields: Any
) -> dict[str, Any]:
    """A `[[models]]` entry serving the demo pooling model of `kind` from `path`.

    `fields` add or override settings of the entry (`preload=True`, `batching={...}`, ...).
    """
    entry: dict[str, Any] = {"name": name or DEMO_NAMES[kind], "path": str(Path(path)), "kind": kind}
    if kind == "embed":
        entry["matryoshka_dimensions"] = []  # random weights: any cut is as good as another
    return {**entry, **fields}


def is_complete(folder: Path, kind: PoolingKind) -> bool:
    """Whether folder holds a finished demo pooling model of `kind` and the current format."""
    marker = Path(folder) / MARKER_NAME
    return marker.is_file() and marker.read_text().strip() == _marker_text(kind)


def _marker_text(kind: PoolingKind) -> str:
    return f"pooling-{kind}-{FORMAT_VERSION}"


def _build(target_dir: Path, kind: PoolingKind, progress: Callable[[str], None] | None) -> Path:
    target_dir = Path(target_dir)
    report = progress or (lambda _message: None)
    if is_complete(target_dir, kind):
        return target_dir
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename it into place, so that a crash never leaves a
    # half-built folder where a finished one is expected.
    scratch = Path(tempfile.mkdtemp(prefix=f".{target_dir.name}.partial-", dir=target_dir.parent))
    scratch.chmod(0o755)  # mkdtemp makes it private; the model is meant to be shared.
    try:
        _build_into(scratch, kind, report)
        _move_into_place(scratch, target_dir, kind)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report("done")
    return target_dir


def _move_into_place(scratch: Path, target_dir: Path, kind: PoolingKind) -> None:
    if target_dir.exists() and not is_complete(target_dir, kind):
        # Left over from an older format or another kind, or not ours: replace it.
        shutil.rmtree(target_dir)
    try:
        os.rename(scratch, target_dir)
    except OSError:
        # Another process may have finished first; its model is as good as ours.
        if not is_complete(target_dir, kind):
            raise


def _build_into(folder: Path, kind: PoolingKind, report: Callable[[str], None]) -> None:
    report("training tokenizer")
    tokenizer = _make_tokenizer()
    report("building weights")
    model = _make_model(tokenizer, kind)
    report("saving")
    save_quietly(model, tokenizer, folder)
    if kind == "embed":
        _write_sentence_transformers_files(folder)
    # The marker goes last: its presence means every other file is complete.
    (folder / MARKER_NAME).write_text(_marker_text(kind) + "\n")


def _write_sentence_transformers_files(folder: Path) -> None:
    """Declare mean pooling and normalization as sentence-transformers does, so that every runner
    (ours, vLLM's, sentence-transformers') pools the embedder the same way."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    pooling = {
        "word_embedding_dimension": HIDDEN_SIZE,
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False,
        "include_prompt": True,
    }
    (folder / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2) + "\n")
    (folder / "2_Normalize").mkdir()
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": MAX_POSITIONS, "do_lower_case": False}, indent=2) + "\n"
    )


def _make_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok = train_bpe(SPECIAL_TOKENS, UNK)
    # BERT's templates: one text, and a (query, document) pair for the cross-encoder, the second
    # segment marked by token type 1.
    specials = [(CLS, tok.token_to_id(CLS)), (SEP, tok.token_to_id(SEP))]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}", pair=f"{CLS} $A {SEP} $B:1 {SEP}:1", special_tokens=specials
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token=UNK,
        pad_token=PAD,
        cls_token=CLS,
        sep_token=SEP,
        mask_token=MASK,
        model_max_length=MAX_POSITIONS,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def _make_model(tokenizer: PreTrainedTokenizerFast, kind: PoolingKind) -> PreTrainedModel:
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    labels = CLASSIFIER_LABELS if kind == "classify" else ("score",)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN_SIZE,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=4 * HIDDEN_SIZE,
        max_position_embeddings=MAX_POSITIONS,
        type_vocab_size=2,
        initializer_range=INITIALIZER_RANGE,
        pad_token_id=tokenizer.pad_token_id,
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        dtype="float32",
    )
    # A fixed seed per kind on a private RNG state: the same weights every time, and the caller's
    # random state is left alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED + ("embed", "classify", "score").index(kind))
        model = BertModel(config) if kind == "embed" else BertForSequenceClassification(config)
    model.eval()  # inference mode: no dropout
    return model
