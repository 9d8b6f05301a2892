"""A tiny random-weight vision-language model in Hugging Face format, built offline.

The Idefics3 architecture (SmolVLM's): a small vision encoder whose patches are shuffled into a few
tokens per image, a projector, and the demo model's Llama shape and tokenizer with the image tokens
added. Like the demo model it talks nonsense, but vLLM's CPU build runs it as it runs a real one:
the image goes through its own processor and vision tower, so the same image gives the same greedy
answer and two images give different ones. Its processor works without torchvision (which these
machines do not have: vLLM's LLaVA, Qwen2-VL and Gemma 3 paths import it, Idefics3's does not).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from switchboard.local.demo_model import BOS, EOS, PAD, SPECIAL_TOKENS, UNK, save_quietly, train_bpe

FORMAT_VERSION = "1"
MARKER_NAME = ".switchboard-demo-model"
SEED = 4321
# 56 x 56 pixels in patches of 14: 16 patches, shuffled by 2 x 2 into 4 tokens per image.
IMAGE_SIZE = 56
PATCH_SIZE = 14
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2
IMAGE_TOKENS = ["<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"]
# The processor's tiles of a split image name their place; splitting is off, but it looks them up.
TILE_TOKENS = [f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)]

# The demo model's "<|role|>" lines, with an image part rendered as its placeholder.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_utterance>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def build_demo_vision_model(
    target_dir: Path, *, progress: Callable[[str], None] | None = None, seed: int = SEED
) -> Path:
    """Build the tiny vision-language model into target_dir unless a complete one is there."""
    target_dir = Path(target_dir)
    report = progress or (lambda _message: None)
    if is_complete(target_dir):
        return target_dir
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target_dir.name}.partial-", dir=target_dir.parent))
    scratch.chmod(0o755)
    try:
        report("building the vision-language model")
        _build_into(scratch, seed)
        (scratch / MARKER_NAME).write_text(FORMAT_VERSION + "\n")
        if target_dir.exists():
            shutil.rmtree(target_dir)
        scratch.rename(target_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report("done")
    return target_dir


def is_complete(folder: Path) -> bool:
    """Whether folder holds a finished model of the current format."""
    marker = Path(folder) / MARKER_NAME
    return marker.is_file() and marker.read_text().strip() == FORMAT_VERSION


def _build_into(folder: Path, seed: int) -> None:
    import torch
    from transformers import Idefics3ForConditionalGeneration, Idefics3ImageProcessor, Idefics3Processor

    tokenizer = _make_tokenizer()
    config = _config(tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Idefics3ForConditionalGeneration(config)
    model.eval()
    image_processor = Idefics3ImageProcessor(
        do_image_splitting=False,
        size={"longest_edge": IMAGE_SIZE},
        max_image_size={"longest_edge": IMAGE_SIZE},
    )
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=IMAGE_SEQ_LEN,
        chat_template=CHAT_TEMPLATE,
    )
    save_quietly(model, processor, folder)  # the processor saves its tokenizer with it


def _make_tokenizer() -> Any:
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok = train_bpe(SPECIAL_TOKENS + IMAGE_TOKENS + TILE_TOKENS, UNK)
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
        extra_special_tokens={
            "image_token": "<image>",
            "fake_image_token": "<fake_token_around_image>",
            "global_image_token": "<global-img>",
            "end_of_utterance_token": "<end_of_utterance>",
        },
    )


def _config(tokenizer: Any) -> Any:
    from transformers import Idefics3Config, Idefics3VisionConfig, LlamaConfig

    vision = Idefics3VisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
    )
    text = LlamaConfig(
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
    )
    return Idefics3Config(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        scale_factor=SCALE_FACTOR,
    )
