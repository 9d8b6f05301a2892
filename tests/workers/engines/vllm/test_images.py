"""Images on vLLM: the tiny vision-language model (switchboard/local/demo_vision_model.py) on the real
engine of this repo, and the parts of `workers.engines.vllm.images` and `io` that need no engine.

One engine is started for the module (vLLM's CPU build, ~20 s) and shared by the checks marked e2e,
all driven from the module's loop (vLLM's output task belongs to the loop that started the engine).
"""

from __future__ import annotations

import asyncio
import io
import json
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import numpy as np
import pytest
import pytest_asyncio
from PIL import Image

from switchboard.config import ModelConfig
from switchboard.context_length import CONTEXT_LENGTH_EXCEEDED
from switchboard.local.demo_vision_model import CHAT_TEMPLATE, IMAGE_SEQ_LEN, build_demo_vision_model
from switchboard.wire import ChatMessage, ImageInput, SamplingParams
from workers.engines.base import EngineRequest, InvalidEngineRequest
from workers.engines.prompts import BuiltPrompt
from workers.engines.vllm.images import (
    DEFAULT_IMAGES_PER_PROMPT,
    ImagePrompts,
    decoded_images,
    image_engine_args,
    image_prompts,
    min_image_tokens,
)
from workers.engines.vllm.io import engine_prompt, expanded_prompt_tokens, refusal_of

CONTEXT = 256
QUESTION = "What is this?"
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, logprobs=0)
ANY_LENGTH = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def vision_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(build_demo_vision_model(tmp_path_factory.mktemp("vision") / "model"))


def png(picture: Image.Image) -> ImageInput:
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return ImageInput(
        media_type="image/png", data=buffer.getvalue(), width=picture.width, height=picture.height
    )


BLACK = png(Image.new("RGB", (56, 56)))
NOISE = png(Image.fromarray(np.random.default_rng(7).integers(0, 256, (56, 56, 3), dtype=np.uint8)))


def chat(
    *images: ImageInput, request_id: str, sampling: SamplingParams = GREEDY, text: str = QUESTION
) -> EngineRequest:
    """One user message: its images, then the text."""
    parts: tuple[str | int, ...] = (*range(len(images)), text) if images else ()
    message = ChatMessage(role="user", content=text, parts=parts)
    return EngineRequest(request_id=request_id, sampling=sampling, messages=(message,), images=images)


# --- without an engine ----------------------------------------------------------------------------


def test_a_vision_model_takes_several_images_per_prompt(vision_dir: Path, demo_model_dir: Path) -> None:
    vision = ModelConfig(name="vlm", path=str(vision_dir))
    assert image_engine_args(vision, {}) == {"limit_mm_per_prompt": {"image": DEFAULT_IMAGES_PER_PROMPT}}
    # The model's own setting wins; an entry that turns images off takes none; a text model has none.
    assert image_engine_args(vision, {"limit_mm_per_prompt": {"image": 2}}) == {}
    off = ModelConfig(name="vlm", path=str(vision_dir), images=False)
    assert image_engine_args(off, {}) == {"limit_mm_per_prompt": {"image": 0}}
    assert image_engine_args(ModelConfig(name="demo", path=str(demo_model_dir)), {}) == {}


def test_the_fewest_image_tokens_by_the_models_own_processor(vision_dir: Path) -> None:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(vision_dir)
    assert min_image_tokens(processor, processor.tokenizer, processor.chat_template) == IMAGE_SEQ_LEN


@pytest.fixture(scope="module")
def legacy_dir(vision_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The vision model with its template where older processors keep it (`chat_template.json`),
    which its tokenizer does not read."""
    folder = tmp_path_factory.mktemp("legacy") / "model"
    shutil.copytree(vision_dir, folder)
    template = (folder / "chat_template.jinja").read_text()
    (folder / "chat_template.jinja").unlink()
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    return folder


def started(folder: Path, *, images_per_prompt: int, multimodal: bool = True) -> Any:
    """What `image_prompts` reads of a started AsyncLLM, its processor loaded as vLLM loads it."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(folder)
    limits = SimpleNamespace(get_limit_per_prompt=lambda modality: images_per_prompt)
    config = SimpleNamespace(
        is_multimodal_model=multimodal, multimodal_config=limits, model=str(folder), trust_remote_code=False
    )
    info = SimpleNamespace(get_hf_processor=lambda: processor)
    return SimpleNamespace(
        model_config=config, renderer=SimpleNamespace(get_mm_processor=lambda: SimpleNamespace(info=info))
    )


def test_a_template_kept_with_the_processor_is_the_models(legacy_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(legacy_dir)
    assert tokenizer.chat_template is None
    model = ModelConfig(name="vlm", path=str(legacy_dir))
    takes = image_prompts(started(legacy_dir, images_per_prompt=8), tokenizer, model)
    assert takes == ImagePrompts(
        chat_template=CHAT_TEMPLATE, content_parts=True, min_image_tokens=IMAGE_SEQ_LEN
    )
    # Images turned off (vLLM builds no processor, or the entry says so): still the model's template,
    # its content as parts.
    off = ImagePrompts(chat_template=CHAT_TEMPLATE, content_parts=True, min_image_tokens=None)
    assert image_prompts(started(legacy_dir, images_per_prompt=0), tokenizer, model) == off
    entry_off = ModelConfig(name="vlm", path=str(legacy_dir), images=False)
    assert image_prompts(started(legacy_dir, images_per_prompt=8), tokenizer, entry_off) == off
    text_model = started(legacy_dir, images_per_prompt=0, multimodal=False)
    assert image_prompts(text_model, tokenizer, model) == ImagePrompts()


def test_bytes_that_are_no_image_are_the_clients() -> None:
    assert [picture.size for picture in decoded_images([BLACK, NOISE])] == [(56, 56), (56, 56)]
    broken = ImageInput(media_type="image/png", data=BLACK.data[:40], width=56, height=56)
    with pytest.raises(InvalidEngineRequest) as caught:
        decoded_images([BLACK, broken])
    assert (caught.value.param, caught.value.code) == ("messages", "invalid_image")
    assert "Image 2" in str(caught.value)


def test_the_engine_prompt_carries_the_images_in_order() -> None:
    pytest.importorskip("vllm")
    prompt = BuiltPrompt([5, 4, 6, 4], "x", images=(NOISE, BLACK), image_tokens=8)
    inputs = engine_prompt(prompt, "salt")
    assert inputs["prompt_token_ids"] == [5, 4, 6, 4] and inputs["cache_salt"] == "salt"
    pictures = inputs["multi_modal_data"]["image"]
    assert np.asarray(pictures[0]).max() > 0 and np.asarray(pictures[1]).max() == 0  # noise, black


def test_usage_counts_the_prompt_as_vllm_expanded_it() -> None:
    class Output(msgspec.Struct):
        prompt_token_ids: list[int] | None

    prompt = BuiltPrompt([1, 2, 3, 9], "x", continuation_tokens=1, images=(BLACK,), image_tokens=4)
    assert prompt.prompt_tokens == 3 + 4  # before vLLM says: its images at their fewest
    assert expanded_prompt_tokens(Output(prompt_token_ids=None), prompt) == 7
    assert expanded_prompt_tokens(Output(prompt_token_ids=list(range(10))), prompt) == 9


def test_a_prompt_its_images_made_too_long_is_refused_as_too_long() -> None:
    pytest.importorskip("vllm")
    from vllm.exceptions import VLLMValidationError

    vllms = VLLMValidationError(
        "The decoder prompt (length 48) is longer than the maximum model length of 40. Make sure that "
        "`max_model_len` is no smaller than the number of text tokens plus multimodal tokens."
    )
    refused = refusal_of(vllms, before_output=True, prompt_param="messages")
    assert refused is not None
    assert (refused.param, refused.code) == ("messages", CONTEXT_LENGTH_EXCEEDED)
    assert "40 tokens" in str(refused) and "48" in str(refused)


# --- on the engine --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_kv_cache() -> Iterator[None]:
    """vLLM's CPU build checks NUMA node 0's free memory unless the KV cache size is given."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
        yield


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(vision_dir: Path, small_kv_cache: None) -> AsyncIterator[Any]:
    from workers.engines.vllm import VllmEngine
    from workers.runtime.cpu_placement import available_cores

    args = {"max_model_len": CONTEXT, "max_num_seqs": 4, "dtype": "float32", "enforce_eager": True}
    core = available_cores()[0]
    started = VllmEngine(
        ModelConfig(name="vlm", path=str(vision_dir), engine_args=args),
        cpu_threads=f"{core}-{core}",
        cpu_kvcache_gib=1,
        engine_process="fork",
    )
    await started.start()
    yield started
    await started.stop()


class Answer(msgspec.Struct):
    text: str
    token_logprobs: list[float | None]
    prompt_tokens: int
    completion_tokens: int


async def answer(engine: Any, request: EngineRequest) -> Answer:
    text, logprobs, prompt_tokens, completion_tokens = "", [], 0, 0
    async for delta in engine.generate(request):
        text += delta.text
        logprobs += [position.logprob for position in delta.logprobs]
        prompt_tokens, completion_tokens = delta.prompt_tokens, delta.completion_tokens
    return Answer(text, logprobs, prompt_tokens, completion_tokens)


@pytest.mark.e2e
@pytest.mark.asyncio(loop_scope="module")
async def test_the_fewest_image_tokens_are_published(engine: Any) -> None:
    limits = engine.limits()
    assert limits is not None and limits.min_image_tokens == IMAGE_SEQ_LEN


@pytest.mark.e2e
@pytest.mark.asyncio(loop_scope="module")
async def test_an_image_becomes_its_tokens_in_the_prompt(engine: Any) -> None:
    with_image = await answer(engine, chat(BLACK, request_id="one"))
    text_only = await answer(engine, chat(request_id="text"))
    assert with_image.completion_tokens == text_only.completion_tokens == 8
    # vLLM's count: the placeholder expanded into the image's tokens (and the markers around them).
    assert with_image.prompt_tokens >= text_only.prompt_tokens + IMAGE_SEQ_LEN


@pytest.mark.e2e
@pytest.mark.asyncio(loop_scope="module")
async def test_the_same_image_gives_the_same_greedy_answer_alone_and_in_a_batch(engine: Any) -> None:
    alone = await answer(engine, chat(BLACK, request_id="alone"))
    batch = await asyncio.gather(*(answer(engine, chat(BLACK, request_id=f"batch-{i}")) for i in range(3)))
    assert {one.text for one in batch} == {alone.text}
    assert all(one.token_logprobs == pytest.approx(alone.token_logprobs, abs=1e-3) for one in batch)


@pytest.mark.e2e
@pytest.mark.asyncio(loop_scope="module")
async def test_another_image_gives_another_answer(engine: Any) -> None:
    black = await answer(engine, chat(BLACK, request_id="black"))
    noise = await answer(engine, chat(NOISE, request_id="noise"))
    assert black.prompt_tokens == noise.prompt_tokens
    assert (black.text, black.token_logprobs) != (noise.text, noise.token_logprobs)


@pytest.mark.e2e
@pytest.mark.asyncio(loop_scope="module")
async def test_two_images_in_one_message(engine: Any) -> None:
    one = await answer(engine, chat(BLACK, request_id="first"))
    two = await answer(engine, chat(BLACK, NOISE, request_id="two"))
    swapped = await answer(engine, chat(NOISE, BLACK, request_id="swapped"))
    assert two.prompt_tokens == swapped.prompt_tokens >= one.prompt_tokens + IMAGE_SEQ_LEN
    assert two.text != swapped.text or two.token_logprobs != swapped.token_logprobs


@pytest.mark.e2e
@pytest.mark.asyncio(loop_scope="module")
async def test_images_the_parts_do_not_name_are_refused(engine: Any) -> None:
    message = ChatMessage(role="user", content=QUESTION, parts=(0, QUESTION))
    request = EngineRequest(request_id="r", sampling=GREEDY, messages=(message,), images=(BLACK, NOISE))
    with pytest.raises(InvalidEngineRequest) as caught:
        await answer(engine, request)
    assert (caught.value.param, caught.value.code) == ("messages", "invalid_value")


@pytest.mark.e2e
@pytest.mark.asyncio(loop_scope="module")
async def test_max_tokens_past_the_expanded_prompt_are_refused(engine: Any) -> None:
    """The prompt's own count (its image at its fewest) leaves room for max_tokens; vLLM's, with
    the markers around the image's tokens, does not: a 400, as for any prompt, not a cut answer."""
    counted = engine._prompts.build(chat(BLACK, request_id="count")).prompt_tokens
    sampling = SamplingParams(max_tokens=CONTEXT - counted, temperature=0.0)
    with pytest.raises(InvalidEngineRequest) as caught:
        await answer(engine, chat(BLACK, request_id="long", sampling=sampling))
    assert (caught.value.param, caught.value.code) == ("max_tokens", CONTEXT_LENGTH_EXCEEDED)
    # The engine goes on serving.
    assert (await answer(engine, chat(BLACK, request_id="after"))).completion_tokens == 8


@pytest.mark.e2e
@pytest.mark.asyncio(loop_scope="module")
async def test_a_prompt_its_images_expand_past_the_context_is_a_400(engine: Any) -> None:
    images = (BLACK,) * DEFAULT_IMAGES_PER_PROMPT
    # Text long enough that the images at their fewest still fit, but not as vLLM expands them.
    fewest = DEFAULT_IMAGES_PER_PROMPT * IMAGE_SEQ_LEN
    words = "tell me a story about it"
    while engine._prompts.build(chat(*images, request_id="n", text=words)).prompt_tokens < CONTEXT - 8:
        words += " again"
    built = engine._prompts.build(chat(*images, request_id="n", text=words))
    assert built.prompt_tokens < CONTEXT and built.image_tokens == fewest
    with pytest.raises(InvalidEngineRequest) as caught:
        # No max_tokens: the rest of the context, which the prompt's own count leaves.
        await answer(engine, chat(*images, request_id="too-long", text=words, sampling=ANY_LENGTH))
    assert (caught.value.param, caught.value.code) == ("messages", CONTEXT_LENGTH_EXCEEDED)
    assert "with its images" in str(caught.value)  # vLLM's refusal, not the prompt's own count
