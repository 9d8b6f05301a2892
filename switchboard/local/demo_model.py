"""A tiny random-weight Llama model in Hugging Face format, built offline.

It talks nonsense, but vLLM and Transformers load it like a real model, so demos and
tests can run the whole serving path without downloading anything.
"""

from __future__ import annotations

import os
import shutil
import string
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from switchboard.config import DEMO_MODEL_NAME, demo_model

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

# Bump when the files produced change, so old folders are rebuilt rather than reused.
FORMAT_VERSION = "1"
MARKER_NAME = ".switchboard-demo-model"

SPECIAL_TOKENS = ["<s>", "</s>", "<unk>", "<pad>"]
BOS, EOS, UNK, PAD = SPECIAL_TOKENS
VOCAB_SIZE = 400
SEED = 1234

# A "<|role|>" line, then the content, per message; a random model needs nothing richer.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# Fixed training text: the merges, and so the token ids, depend only on this.
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A router sends each request to the worker that serves the model.",
    "Hello! How are you today? I am fine, thank you.",
    "The weather was cold, so we stayed inside and read a book.",
    "She opened the window and the morning light filled the room.",
    "Please write a short poem about the sea and the stars.",
    "What is the capital of France? The capital of France is Paris.",
    "Numbers like 1, 2, 3, 42 and 2024 appear in many texts.",
    "def add(a, b): return a + b  # a small Python function",
    "The cat sat on the mat, and the dog slept by the door.",
    "Every morning he walks to the station and takes the train.",
    "Models generate text one token at a time until they stop.",
    "The server streams tokens to the client as soon as they are ready.",
    "We tested the system with many requests at the same time.",
    "Can you explain how a computer stores numbers in memory?",
    "The river flows through the valley toward the distant ocean.",
    "Good ideas often start as questions that nobody has asked.",
    "They planted trees in the garden and watered them every day.",
    "This is a test. This is only a test of the demo model.",
    "The answer is simple: keep the interface small and clear.",
    "Our team meets on Monday, Wednesday and Friday at noon.",
    'He said, "Let\'s go home," and we all agreed with him.',
    "The library is open from 9 to 5, except on Sunday.",
    "Reading other people's code is a good way to learn.",
    "Send the result back to the user when the work is done.",
    "Write clear tests, and run them before you share your work.",
    "A queue holds the requests while the workers are busy.",
    "Light travels faster than sound, so we see lightning first.",
    "If the cache is full, the oldest entries are removed first.",
    "Keep your answers short, honest and kind.",
    "Tokens, words and sentences: text has structure at every level.",
    "Is it going to rain tomorrow? Maybe, but the sun may shine too.",
]


def build_demo_model(
    target_dir: Path, *, progress: Callable[[str], None] | None = None, seed: int = SEED
) -> Path:
    """Build the demo model into target_dir unless a complete one is already there. Another `seed`
    gives another model of the same shape and tokenizer, which answers differently (a second
    version of the demo model, for routes and rollouts)."""
    target_dir = Path(target_dir)
    report = progress or (lambda _message: None)
    if is_complete(target_dir):
        return target_dir
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename it into place, so that a crash never leaves a
    # half-built folder where a finished one is expected.
    prefix = f".{target_dir.name}.partial-"
    scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=target_dir.parent))
    scratch.chmod(0o755)  # mkdtemp makes it private; the model is meant to be shared.
    try:
        _build_into(scratch, report, seed)
        _move_into_place(scratch, target_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report("done")
    return target_dir


def config_entry(path: Path, *, name: str = DEMO_MODEL_NAME, **fields: Any) -> dict[str, Any]:
    """A `[[models]]` entry serving the demo model from `path`, as `switchboard up` would.

    `fields` add or override settings of the entry (`preload=True`, `keep_alive_s=5`, ...).
    """
    model = demo_model(str(path))
    return {"name": name, "path": model.path, "engine_args": dict(model.engine_args), **fields}


def is_complete(folder: Path) -> bool:
    """Whether folder holds a finished demo model of the current format."""
    marker = Path(folder) / MARKER_NAME
    return marker.is_file() and marker.read_text().strip() == FORMAT_VERSION


def _build_into(folder: Path, report: Callable[[str], None], seed: int) -> None:
    report("training tokenizer")
    tokenizer = _make_tokenizer()
    report("building weights")
    model = _make_model(tokenizer, seed)
    report("saving")
    save_quietly(model, tokenizer, folder)
    # The marker goes last: its presence means every other file is complete.
    (folder / MARKER_NAME).write_text(FORMAT_VERSION + "\n")


def save_quietly(model: Any, tokenizer: Any, folder: Path) -> None:
    """Save a model and its tokenizer in Hugging Face format, without transformers' progress bars."""
    from transformers.utils import logging as hf_logging

    # Our own progress lines say what happens; a progress bar for one small shard is noise.
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()


def _move_into_place(scratch: Path, target_dir: Path) -> None:
    if target_dir.exists() and not is_complete(target_dir):
        # Left over from an older format, or not ours: replace it.
        shutil.rmtree(target_dir)
    try:
        os.rename(scratch, target_dir)
    except OSError:
        # Another process may have finished first; its model is as good as ours.
        if not is_complete(target_dir):
            raise


def _make_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok = train_bpe(SPECIAL_TOKENS, UNK)
    # Like Llama's tokenizer, prepend <s> when asked to add special tokens.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
    )


def train_bpe(special_tokens: list[str], unk: str) -> Tokenizer:
    """A BPE tokenizer trained on CORPUS with `special_tokens` first (its templates are the caller's).

    Metaspace, not byte-level BPE: each token is whole characters, never part of a UTF-8 sequence,
    so every token a random model emits decodes to text at once. The alphabet is all printable
    ASCII, so no ASCII text needs `unk`; spaces arrive as U+2581.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(models.BPE(unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    tok.decoder = decoders.Metaspace(prepend_scheme="never")
    alphabet = [c for c in string.printable if c != " "] + ["\u2581"]
    trainer = BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=special_tokens,
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


def _make_model(tokenizer: PreTrainedTokenizerFast, seed: int) -> LlamaForCausalLM:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        num_attention_heads=4,  # head_dim 64: vLLM's CPU attention refuses 16.
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=512,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    # A fixed seed on a private RNG state: the same weights every time, and the
    # caller's random state is left alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    _discourage_special_tokens(model, tokenizer)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.eval()  # inference mode: no dropout
    return model


def _discourage_special_tokens(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast) -> None:
    """Make special and control-character tokens rare, so replies run to max_tokens."""
    import torch

    vocab = tokenizer.get_vocab()
    unwanted = set(tokenizer.all_special_ids) | {vocab[c] for c in "\r\x0b\x0c"}
    with torch.no_grad():
        weight = model.lm_head.weight
        # Sharpen every logit, then zero the unwanted rows: a logit of 0 is then far
        # below the top ones, so greedy decoding never picks them and sampling rarely.
        weight.mul_(8.0)
        weight[sorted(unwanted)] = 0.0
