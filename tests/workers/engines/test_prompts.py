"""workers.engines.prompts: chat template, tokenization and length checks, with the demo model's tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from switchboard.local.demo_model import VOCAB_SIZE
from switchboard.wire import ChatMessage, ImageInput, SamplingParams, ToolCall
from workers.engines.base import EngineRequest, InvalidEngineRequest
from workers.engines.prompts import QUICK_BUILD_MAX_CHARS, PromptBuilder, builds_quickly, longest_token_chars

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

# The demo tokenizer's longest entry ("▁requests") is 9 characters.
LONGEST_TOKEN = 9
SMALL_CONTEXT = 16


@pytest.fixture
def own_tokenizer(demo_model_dir: Path) -> Any:
    """A tokenizer of this test's own, whose chat template it may change."""
    return transformers.AutoTokenizer.from_pretrained(demo_model_dir)


class Counting:
    """The tokenizer, counting the calls that cost time on a long prompt."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.encodes = 0
        self.templates = 0

    def encode(self, *args: Any, **kwargs: Any) -> Any:
        self.encodes += 1
        return self.inner.encode(*args, **kwargs)

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        self.templates += 1
        return self.inner.apply_chat_template(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def builder(tokenizer: Any, max_model_len: int = 256) -> PromptBuilder:
    return PromptBuilder(tokenizer, model_name="demo", max_model_len=max_model_len, vocab_size=VOCAB_SIZE)


def text_request(prompt: str | tuple[int, ...]) -> EngineRequest:
    return EngineRequest(request_id="r", sampling=SamplingParams(), prompt=prompt)


def chat_request(*messages: ChatMessage, tools: str | None = None) -> EngineRequest:
    return EngineRequest(request_id="r", sampling=SamplingParams(), messages=messages, tools=tools)


def refusal(prompts: PromptBuilder, request: EngineRequest) -> InvalidEngineRequest:
    with pytest.raises(InvalidEngineRequest) as caught:
        prompts.build(request)
    return caught.value


# --- limits ---------------------------------------------------------------------------------------


def test_limits(tokenizer: Any) -> None:
    assert len(tokenizer) == VOCAB_SIZE == 400
    limits = builder(tokenizer, 64).limits
    assert (limits.max_model_len, limits.vocab_size, limits.max_token_chars) == (64, 400, LONGEST_TOKEN)


def test_no_token_stands_for_more_characters_than_the_bound(tokenizer: Any) -> None:
    bound = longest_token_chars(tokenizer)
    assert bound == max(len(entry) for entry in tokenizer.get_vocab())
    assert all(len(tokenizer.decode([token])) <= bound for token in range(len(tokenizer)))


class Vocabulary:
    def __init__(self, entries: list[str]) -> None:
        self.entries = entries

    def get_vocab(self) -> dict[str, int]:
        return {entry: token for token, entry in enumerate(self.entries)}


@pytest.mark.parametrize(("entries", "longest"), [(["a", "abcd", "ab"], 4), ([], 1), ([""], 1)])
def test_longest_token_chars(entries: list[str], longest: int) -> None:
    assert longest_token_chars(Vocabulary(entries)) == longest


# --- plain prompts --------------------------------------------------------------------------------


def test_text_prompt(tokenizer: Any) -> None:
    built = builder(tokenizer).build(text_request("Hello world"))
    assert built.token_ids == tokenizer.encode("Hello world", add_special_tokens=True)
    assert built.token_ids[0] == tokenizer.bos_token_id
    assert built.text == "Hello world"


def test_text_longer_than_possible_is_refused_without_tokenizing(tokenizer: Any) -> None:
    counting = Counting(tokenizer)
    limit = SMALL_CONTEXT * LONGEST_TOKEN
    error = refusal(builder(counting, SMALL_CONTEXT), text_request("a" * (limit + 1)))
    assert counting.encodes == 0
    assert (error.param, error.code) == ("prompt", "context_length_exceeded")
    assert f"{SMALL_CONTEXT} tokens" in str(error)
    assert f"{limit + 1} characters long" in str(error)
    assert f"({limit} characters)" in str(error)


def test_text_at_the_limit_is_tokenized(tokenizer: Any) -> None:
    counting = Counting(tokenizer)
    # As long as it may be without tokenizing; tokenized, it takes more than the context.
    error = refusal(builder(counting, SMALL_CONTEXT), text_request("a" * (SMALL_CONTEXT * LONGEST_TOKEN)))
    assert counting.encodes == 1
    assert (error.param, error.code) == ("prompt", "context_length_exceeded")
    assert "alone takes" in str(error)


def test_a_prompt_must_leave_room_for_a_completion(tokenizer: Any) -> None:
    text = "Hello world"
    tokens = len(tokenizer.encode(text))
    assert builder(tokenizer, tokens + 1).build(text_request(text)).token_ids
    error = refusal(builder(tokenizer, tokens), text_request(text))
    assert (error.param, error.code) == ("prompt", "context_length_exceeded")
    assert f"alone takes {tokens} tokens" in str(error)


def test_token_prompt(tokenizer: Any) -> None:
    ids = tuple(tokenizer.encode("Hello world", add_special_tokens=False))
    counting = Counting(tokenizer)
    built = builder(counting).build(text_request(ids))
    assert built.token_ids == list(ids)
    assert built.text == "Hello world"
    assert counting.encodes == 0


@pytest.mark.parametrize("outside", [400, 10**6, -1])
def test_token_prompt_outside_the_vocabulary(tokenizer: Any, outside: int) -> None:
    error = refusal(builder(tokenizer), text_request((5, outside, 7)))
    assert error.param == "prompt"
    assert "0 to 399" in str(error)
    assert str(outside) in str(error)


def test_token_prompt_outside_the_vocabulary_has_the_front_doors_code(tokenizer: Any) -> None:
    assert refusal(builder(tokenizer), text_request((5, 400))).code == "invalid_value"


def test_token_prompt_too_long(tokenizer: Any) -> None:
    error = refusal(builder(tokenizer, SMALL_CONTEXT), text_request(tuple(range(5, 5 + SMALL_CONTEXT))))
    assert (error.param, error.code) == ("prompt", "context_length_exceeded")


# --- chat prompts ---------------------------------------------------------------------------------


def test_chat_prompt(tokenizer: Any) -> None:
    request = chat_request(
        ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="Hi there")
    )
    built = builder(tokenizer).build(request)
    assert built.text == "<s><|system|>\nBe brief.\n<|user|>\nHi there\n<|assistant|>\n"
    # The template writes the BOS token; tokenizing must not add another.
    assert built.token_ids == tokenizer.encode(built.text, add_special_tokens=False)
    assert built.token_ids.count(tokenizer.bos_token_id) == 1


def test_messages_longer_than_possible_are_refused_without_templating(tokenizer: Any) -> None:
    counting = Counting(tokenizer)
    half = SMALL_CONTEXT * LONGEST_TOKEN // 2
    request = chat_request(
        ChatMessage(role="user", content="a" * half), ChatMessage(role="user", content="b" * (half + 1))
    )
    error = refusal(builder(counting, SMALL_CONTEXT), request)
    assert (counting.encodes, counting.templates) == (0, 0)
    assert (error.param, error.code) == ("messages", "context_length_exceeded")


def test_messages_too_long_once_templated(tokenizer: Any) -> None:
    counting = Counting(tokenizer)
    request = chat_request(*(ChatMessage(role="user", content="Hi") for _ in range(8)))
    error = refusal(builder(counting, SMALL_CONTEXT), request)
    assert (counting.encodes, counting.templates) == (1, 1)
    assert (error.param, error.code) == ("messages", "context_length_exceeded")


def test_a_template_that_raises_is_the_clients_mistake(own_tokenizer: Any) -> None:
    own_tokenizer.chat_template = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System messages are not supported.') }}"
        "{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    prompts = builder(own_tokenizer)
    assert prompts.build(chat_request(ChatMessage(role="user", content="Hi"))).text == "Hi"
    error = refusal(prompts, chat_request(ChatMessage(role="system", content="Be brief.")))
    assert error.param == "messages"
    assert "demo" in str(error)
    assert "System messages are not supported." in str(error)
    assert error.__cause__ is not None


def test_no_template_is_the_clients_mistake_too(own_tokenizer: Any) -> None:
    own_tokenizer.chat_template = None
    error = refusal(builder(own_tokenizer), chat_request(ChatMessage(role="user", content="Hi")))
    assert error.param == "messages"


TOOL_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}"
    "{% if m['name'] is defined %}[{{ m['name'] }}]{% endif %}"
    "{% if m['tool_call_id'] is defined %}<{{ m['tool_call_id'] }}>{% endif %}:"
    "{% if m['tool_calls'] is defined %}{% for c in m['tool_calls'] %}"
    "{{ c['id'] }}/{{ c['type'] }}/{{ c['function']['name'] }}"
    "{% if c['function']['arguments'] is mapping %}(city={{ c['function']['arguments']['city'] }})"
    "{% else %}(text={{ c['function']['arguments'] }}){% endif %}"
    "{% endfor %}{% else %}{{ m['content'] }}{% endif %};"
    "{% endfor %}"
    "{% if tools %}tools={{ tools | map(attribute='function') | map(attribute='name') | join(',') }}{% endif %}"
)


def test_tool_calls_reach_the_template_with_arguments_as_mappings(own_tokenizer: Any) -> None:
    own_tokenizer.chat_template = TOOL_TEMPLATE
    tools = json.dumps(
        [
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "get_time"}},
        ]
    )
    request = chat_request(
        ChatMessage(role="user", content="Weather?", name="ann"),
        ChatMessage(
            role="assistant",
            tool_calls=(
                ToolCall(id="call_1", name="get_weather", arguments='{"city": "Oslo"}'),
                ToolCall(id="call_2", name="get_time", arguments="not json"),
            ),
        ),
        ChatMessage(role="tool", content="cold", tool_call_id="call_1"),
        tools=tools,
    )
    built = builder(own_tokenizer).build(request)
    assert built.text == (
        "user[ann]:Weather?;"
        "assistant:call_1/function/get_weather(city=Oslo)call_2/function/get_time(text=not json);"
        "tool<call_1>:cold;"
        "tools=get_weather,get_time"
    )


def test_arguments_nested_too_deeply_to_parse_reach_the_template_as_text(own_tokenizer: Any) -> None:
    own_tokenizer.chat_template = TOOL_TEMPLATE
    deep = "[" * 100_000
    request = chat_request(
        ChatMessage(role="user", content="Hi"),
        ChatMessage(role="assistant", tool_calls=(ToolCall(id="call_1", name="f", arguments=deep),)),
    )
    built = builder(own_tokenizer, max_model_len=200_000).build(request)
    assert f"call_1/function/f(text={deep})" in built.text
    # Where it does not fit, it is the client's refusal, not a RecursionError in the engine.
    with pytest.raises(InvalidEngineRequest) as refused:
        builder(own_tokenizer).build(request)
    assert refused.value.code == "context_length_exceeded"


# --- max_tokens after the prompt ------------------------------------------------------------------


def test_a_completion_that_fits(tokenizer: Any) -> None:
    builder(tokenizer, SMALL_CONTEXT).refuse_completion_too_long(10, SMALL_CONTEXT - 10, "prompt")


@pytest.mark.parametrize("prompt_param", ["prompt", "messages"])
def test_a_completion_that_does_not_fit(tokenizer: Any, prompt_param: str) -> None:
    with pytest.raises(InvalidEngineRequest) as caught:
        builder(tokenizer, SMALL_CONTEXT).refuse_completion_too_long(10, 7, prompt_param)
    error = caught.value
    assert (error.param, error.code) == ("max_tokens", "context_length_exceeded")
    assert f"maximum context length is {SMALL_CONTEXT} tokens" in str(error)
    assert f"you requested 17 tokens (10 in the {prompt_param}, 7 in the completion)" in str(error)
    assert f"Reduce the length of the {prompt_param}" in str(error)


def test_only_short_prompts_are_built_on_the_event_loop() -> None:
    def chat(*messages: ChatMessage, tools: str | None = None) -> EngineRequest:
        return EngineRequest(request_id="r", sampling=SamplingParams(), messages=messages, tools=tools)

    limit = QUICK_BUILD_MAX_CHARS
    assert builds_quickly(chat(ChatMessage(role="user", content="Tell me a story.")))
    assert builds_quickly(chat(ChatMessage(role="user", content="x" * limit)))
    assert not builds_quickly(chat(ChatMessage(role="user", content="x" * (limit + 1))))
    # Every part of the conversation counts: several messages, tools, earlier calls' arguments.
    half = ChatMessage(role="user", content="x" * (limit // 2 + 1))
    assert not builds_quickly(chat(half, half))
    assert not builds_quickly(chat(ChatMessage(role="user", content="hi"), tools="t" * limit))
    call = ToolCall(id="c", name="f", arguments="a" * (limit + 1))
    assert not builds_quickly(chat(ChatMessage(role="assistant", tool_calls=(call,))))
    # Plain prompts: text by its characters, token ids by their count.
    assert builds_quickly(EngineRequest(request_id="r", sampling=SamplingParams(), prompt="p" * limit))
    assert not builds_quickly(
        EngineRequest(request_id="r", sampling=SamplingParams(), prompt=(1,) * (limit + 1))
    )
    continued = EngineRequest(request_id="r", sampling=SamplingParams(), prompt="p", continuation="c" * limit)
    assert not builds_quickly(continued)


# --- images ---------------------------------------------------------------------------------------

# What vision templates do: iterate each message's content as parts ("S" marks a string, which they
# would iterate by character).
PARTS_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}:"
    "{% if m['content'] is string %}S{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<image>{% else %}[{{ p['text'] }}]{% endif %}"
    "{% endfor %}{% endif %};{% endfor %}"
)
IMAGE_A = ImageInput(media_type="image/png", data=b"a", width=1, height=1)
IMAGE_B = ImageInput(media_type="image/png", data=b"b", width=1, height=1)
FEWEST = 4


def vision_builder(tokenizer: Any, max_model_len: int = 256) -> PromptBuilder:
    return PromptBuilder(
        tokenizer,
        model_name="vlm",
        max_model_len=max_model_len,
        vocab_size=VOCAB_SIZE,
        chat_template=PARTS_TEMPLATE,
        min_image_tokens=FEWEST,
    )


def image_request(
    *messages: ChatMessage, images: tuple[ImageInput, ...], continuation: str | None = None
) -> EngineRequest:
    return EngineRequest(
        request_id="r", sampling=SamplingParams(), messages=messages, images=images, continuation=continuation
    )


def test_parts_reach_the_template_as_a_list_in_order(tokenizer: Any) -> None:
    message = ChatMessage(role="user", content="Look:and", parts=("Look:", 1, "and", 0))
    built = vision_builder(tokenizer).build(image_request(message, images=(IMAGE_A, IMAGE_B)))
    assert built.text == "user:[Look:]<image>[and]<image>;"
    # In the order of their placeholders, which is the order the engine takes them in.
    assert built.images == (IMAGE_B, IMAGE_A)
    assert built.image_tokens == 2 * FEWEST
    assert built.prompt_tokens == len(built.token_ids) + 2 * FEWEST
    assert vision_builder(tokenizer).limits.min_image_tokens == FEWEST


def test_a_vision_models_text_messages_are_parts_too(tokenizer: Any) -> None:
    request = chat_request(
        ChatMessage(role="user", content="Hi"),
        ChatMessage(role="assistant", tool_calls=(ToolCall(id="c", name="f", arguments="{}"),)),
    )
    assert vision_builder(tokenizer).build(request).text == "user:[Hi];assistant:;"
    # A vision model that takes no images (its entry turned them off) keeps the template's parts.
    off = PromptBuilder(
        tokenizer,
        model_name="vlm",
        max_model_len=256,
        vocab_size=VOCAB_SIZE,
        chat_template=PARTS_TEMPLATE,
        content_parts=True,
    )
    assert off.limits.min_image_tokens is None
    assert off.build(chat_request(ChatMessage(role="user", content="Hi"))).text == "user:[Hi];"


def test_a_text_models_messages_stay_strings(own_tokenizer: Any) -> None:
    own_tokenizer.chat_template = PARTS_TEMPLATE
    built = builder(own_tokenizer).build(chat_request(ChatMessage(role="user", content="Hi")))
    assert built.text == "user:SHi;"
    assert (built.images, built.image_tokens) == ((), 0)


def test_the_models_own_template_is_used_over_the_tokenizers(tokenizer: Any) -> None:
    built = vision_builder(tokenizer).build(chat_request(ChatMessage(role="user", content="Hi")))
    assert built.text == "user:[Hi];"  # the demo tokenizer's own template writes "<s><|user|>..."


@pytest.mark.parametrize(
    ("parts", "images"),
    [
        ((0, "x"), (IMAGE_A, IMAGE_B)),  # an image no part names
        ((0, 1), (IMAGE_A,)),  # a part that names no image
        ((0, 0), (IMAGE_A, IMAGE_B)),  # an image named twice
        (("x",), (IMAGE_A,)),  # images, and no part names any
    ],
)
def test_each_image_must_be_named_exactly_once(
    tokenizer: Any, parts: tuple[str | int, ...], images: tuple[ImageInput, ...]
) -> None:
    message = ChatMessage(role="user", content="x", parts=parts)
    error = refusal(vision_builder(tokenizer), image_request(message, images=images))
    assert (error.param, error.code) == ("messages", "invalid_value")


def test_an_image_to_a_text_model_is_refused(tokenizer: Any) -> None:
    message = ChatMessage(role="user", content="x", parts=(0, "x"))
    error = refusal(builder(tokenizer), image_request(message, images=(IMAGE_A,)))
    assert (error.param, error.code) == ("messages", "model_takes_no_images")
    assert "`demo` takes no images" in str(error)


def test_images_count_against_the_context_at_their_fewest(tokenizer: Any) -> None:
    message = ChatMessage(role="user", content="x", parts=(0, 1, "x"))
    request = image_request(message, images=(IMAGE_A, IMAGE_B))
    text_tokens = len(vision_builder(tokenizer).build(request).token_ids)
    assert vision_builder(tokenizer, text_tokens + 2 * FEWEST + 1).build(request)
    error = refusal(vision_builder(tokenizer, text_tokens + 2 * FEWEST), request)
    assert (error.param, error.code) == ("messages", "context_length_exceeded")


def test_a_continued_prompt_keeps_its_images(tokenizer: Any) -> None:
    message = ChatMessage(role="user", content="x", parts=(0, "x"))
    built = vision_builder(tokenizer).build(image_request(message, images=(IMAGE_A,), continuation="Hi"))
    assert built.images == (IMAGE_A,) and built.image_tokens == FEWEST
    assert built.prompt_tokens == len(built.token_ids) - built.continuation_tokens + FEWEST


def test_images_are_decoded_off_the_event_loop() -> None:
    message = ChatMessage(role="user", content="Hi", parts=(0, "Hi"))
    assert not builds_quickly(image_request(message, images=(IMAGE_A,)))
