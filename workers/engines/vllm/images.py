"""Images on vLLM: which models take them, how many one prompt may hold, the fewest tokens one becomes,
the chat template that places them, and their decoding into what vLLM's processor reads.

A vision-language model (a `vision_config` in its config.json, as the front door reads it:
`switchboard.vision_models`) takes up to DEFAULT_IMAGES_PER_PROMPT images per prompt unless its
`engine_args` say otherwise, or none where its entry turns images off. Once started, vLLM says whether
it takes them: a multimodal model whose prompts may hold an image.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from switchboard.config import ModelConfig
from switchboard.vision_models import folder_takes_images
from switchboard.wire import ImageInput
from workers.engines.base import InvalidEngineRequest

logger = logging.getLogger(__name__)

# As many as the front door lets one request send by default (`max_images_per_request`). vLLM's own
# default (999) would have it profile memory for a prompt of 999 images.
DEFAULT_IMAGES_PER_PROMPT = 8
# The fewest tokens an image becomes is not always a tiny image's: a processor that scales every
# image up to its longest edge and cuts it into tiles (Idefics3's) gives a long thin one the fewest.
PROBE_EDGE = 2048
PROBE_SIZES = ((1, 1), (PROBE_EDGE, 1), (1, PROBE_EDGE))
# One user message of one image, as the chat template places an image's placeholder.
PROBE_CONVERSATION = [{"role": "user", "content": [{"type": "image"}]}]


@dataclass(frozen=True)
class ImagePrompts:
    """How a model's prompts are built (`PromptBuilder`'s settings of the same names)."""

    chat_template: str | None = None
    content_parts: bool = False
    min_image_tokens: int | None = None


def image_engine_args(model: ModelConfig, configured: dict[str, Any]) -> dict[str, Any]:
    """vLLM's `limit_mm_per_prompt` for a vision-language model (none for a text model: vLLM takes the
    setting from multimodal models only), unless `configured` sets it."""
    if "limit_mm_per_prompt" in configured or not folder_takes_images(str(Path(model.path))):
        return {}
    # Zero where the entry turns images off: vLLM then builds no image processor and profiles none.
    limit = 0 if model.images is False else DEFAULT_IMAGES_PER_PROMPT
    return {"limit_mm_per_prompt": {"image": limit}}


def image_prompts(llm: Any, tokenizer: Any, model: ModelConfig) -> ImagePrompts:
    """How the started engine's prompts are built: a text model's as ever; a multimodal model's with
    its content as parts, its processor's template where the tokenizer has none, and, where it takes
    images (unless its entry turns them off), the fewest tokens one becomes. Runs the model's
    processor: call it off the event loop."""
    config = llm.model_config
    if not config.is_multimodal_model:
        return ImagePrompts()
    takes = model.images is not False and _takes_images(config)
    # vLLM's own Hugging Face processor of the model, with the model's `mm_processor_kwargs`.
    processor = llm.renderer.get_mm_processor().info.get_hf_processor() if takes else None
    template = getattr(tokenizer, "chat_template", None) or _processor_template(llm, processor)
    return ImagePrompts(
        chat_template=template,
        content_parts=True,
        min_image_tokens=min_image_tokens(processor, tokenizer, template) if processor is not None else None,
    )


def _takes_images(config: Any) -> bool:
    multimodal = config.multimodal_config
    return multimodal is not None and multimodal.get_limit_per_prompt("image") > 0


def _processor_template(llm: Any, processor: Any) -> str | None:
    """The template kept with the model's processor (`chat_template.json`), as transformers reads it."""
    if processor is None:
        from transformers import AutoProcessor

        config = llm.model_config
        processor = AutoProcessor.from_pretrained(config.model, trust_remote_code=config.trust_remote_code)
    template = getattr(processor, "chat_template", None)
    return template if isinstance(template, str) else None


def min_image_tokens(processor: Any, tokenizer: Any, template: str | None) -> int:
    """The fewest image tokens the processor makes of one image, over a tiny and two long thin ones.

    A lower bound: the front door counts this many per image, so it must never count more than the
    engine makes. An image's placeholder may expand to more than its image tokens (markers around
    them); those are not counted. Zero where the processor says nothing usable.
    """
    image_token = _image_token_id(processor)
    text = _probe_text(tokenizer, template, processor)
    counts = []
    for size in PROBE_SIZES:
        try:
            ids = processor(text=text, images=[_blank(size)])["input_ids"][0]
        except Exception as exc:  # a processor that refuses such a shape (too thin, too small)
            logger.debug("image probe refused", extra={"size": size, "error": str(exc)})
            continue
        counts.append(sum(1 for token in ids if int(token) == image_token))
    if image_token is None or not counts:
        logger.warning("the fewest tokens of an image are unknown; counting none per image")
        return 0
    return min(counts)


def _image_token_id(processor: Any) -> int | None:
    token_id = getattr(processor, "image_token_id", None)
    if isinstance(token_id, int):
        return token_id
    token = getattr(processor, "image_token", None)
    if not isinstance(token, str):
        return None
    token_id = processor.tokenizer.convert_tokens_to_ids(token)
    return token_id if isinstance(token_id, int) else None


def _probe_text(tokenizer: Any, template: str | None, processor: Any) -> str:
    """One image's placeholder as the chat template writes it (the processor expands only that), else
    the processor's image token."""
    try:
        return str(tokenizer.apply_chat_template(PROBE_CONVERSATION, chat_template=template, tokenize=False))
    except Exception:  # a template that wants more than one image (a system prompt, text)
        return str(getattr(processor, "image_token", ""))


def _blank(size: tuple[int, int]) -> Any:
    from PIL import Image

    return Image.new("RGB", size)


def decoded_images(images: Sequence[ImageInput]) -> list[Any]:
    """The images as RGB pictures for vLLM's processor; bytes that do not decode are the client's."""
    from PIL import Image

    pictures = []
    for number, image in enumerate(images, start=1):
        try:
            with Image.open(io.BytesIO(image.data)) as opened:
                pictures.append(opened.convert("RGB"))
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            # PIL's reason names its own objects (`<_io.BytesIO object at 0x...>`): nothing for a client.
            raise InvalidEngineRequest(
                f"Image {number} of the request ({image.media_type}) does not decode as an image.",
                param="messages",
                code="invalid_image",
            ) from exc
    return pictures
