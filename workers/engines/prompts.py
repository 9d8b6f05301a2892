"""From a request to the prompt's token ids: the chat template, tokenization, and the length checks.

Engine-agnostic: it needs only the model's Hugging Face tokenizer. Building a prompt can take long
for a long one (a template over many messages, a tokenizer over megabytes), so engines build all
but short ones (`builds_quickly`) off their event loop; it refuses what cannot fit before tokenizing it.

Images: the template writes each image's placeholder where its part is, and the engine expands the
placeholder into the image's tokens (their number depends on the image, so only the engine knows it);
the prompt carries the images in the order of their placeholders.
"""

from __future__ import annotations

import json
from typing import Any

from switchboard import context_length
from switchboard.wire import ChatMessage, ImageInput, ModelLimits
from workers.engines.base import EngineRequest, InvalidEngineRequest

# A prompt of up to this many characters is built in a few dozen microseconds, less than handing
# it to a thread and back costs; longer ones are built off the event loop.
QUICK_BUILD_MAX_CHARS = 4096


def builds_quickly(request: EngineRequest) -> bool:
    """Whether the request's prompt is short enough to build on the event loop that drives every stream."""
    if request.images:
        return False  # decoding an image takes milliseconds: more than a hop to a thread and back
    chars = len(request.tools or "") + len(request.continuation or "")
    for message in request.messages or ():
        chars += len(message.content or "") + sum(len(call.arguments) for call in message.tool_calls)
    if request.prompt is not None:
        chars += len(request.prompt)  # characters, or token ids (cheaper still)
    return chars <= QUICK_BUILD_MAX_CHARS


class BuiltPrompt:
    """A request's prompt as the engine takes it, and as text (what `echo` repeats).

    A continued request's `token_ids` end with the `continuation_tokens` of its continuation,
    which are completion tokens, not prompt tokens. A prompt with `images` holds one placeholder for
    each, in their order; the engine expands them into at least `image_tokens` tokens in all.
    """

    def __init__(
        self,
        token_ids: list[int],
        text: str,
        continuation_tokens: int = 0,
        *,
        images: tuple[ImageInput, ...] = (),
        image_tokens: int = 0,
    ) -> None:
        self.token_ids = token_ids
        self.text = text
        self.continuation_tokens = continuation_tokens
        self.images = images
        self.image_tokens = image_tokens

    @property
    def prompt_tokens(self) -> int:
        """The tokens of the prompt alone (at least: its images may expand to more than `image_tokens`)."""
        return len(self.token_ids) - self.continuation_tokens + self.image_tokens


class PromptBuilder:
    """Turns requests into token ids with one model's tokenizer and chat template.

    `chat_template`: the model's template where its tokenizer has none (a vision-language model's may
    live with its processor). `content_parts`: the template reads each message's content as a list of
    parts (vision-language models' templates iterate it: a string would be read character by
    character). `min_image_tokens`: the model takes images, each at least that many prompt tokens;
    None refuses them. A model that takes images always gets its content as parts.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        model_name: str,
        max_model_len: int,
        vocab_size: int,
        chat_template: str | None = None,
        content_parts: bool = False,
        min_image_tokens: int | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self._model_name = model_name
        self._chat_template = chat_template
        self._content_parts = content_parts or min_image_tokens is not None
        self.limits = ModelLimits(
            max_model_len=max_model_len,
            vocab_size=vocab_size,
            max_token_chars=longest_token_chars(tokenizer),
            min_image_tokens=min_image_tokens,
        )

    def build(self, request: EngineRequest) -> BuiltPrompt:
        """The prompt of `request`, refused (InvalidEngineRequest) if it cannot fit the context.

        A continued request's prompt is followed by its continuation's tokens (no special tokens).
        """
        if request.messages is not None:
            prompt = self._chat_prompt(request.messages, request.tools, request.images)
        elif isinstance(request.prompt, tuple):
            prompt = self._token_prompt(list(request.prompt))
        else:
            prompt = self._text_prompt(request.prompt or "")
        if not request.continuation:
            return prompt
        param = "messages" if request.messages is not None else "prompt"
        continued = self._encode(request.continuation, add_special_tokens=False)
        self._refuse_too_long(prompt.prompt_tokens + len(continued), param)
        return BuiltPrompt(
            prompt.token_ids + continued,
            prompt.text,
            continuation_tokens=len(continued),
            images=prompt.images,
            image_tokens=prompt.image_tokens,
        )

    def _chat_prompt(
        self, messages: tuple[ChatMessage, ...], tools: str | None, images: tuple[ImageInput, ...]
    ) -> BuiltPrompt:
        self._refuse_longer_than_possible(sum(len(m.content or "") for m in messages), "messages")
        ordered = self._images_in_order(messages, images)
        image_tokens = len(ordered) * (self.limits.min_image_tokens or 0)
        conversation = [_template_message(m, content_parts=self._content_parts) for m in messages]
        # Only a template of its own is passed: the tokenizer's is the default.
        own_template = {"chat_template": self._chat_template} if self._chat_template is not None else {}
        try:
            text = self._tokenizer.apply_chat_template(
                conversation,
                tools=json.loads(tools) if tools else None,
                add_generation_prompt=True,
                tokenize=False,
                **own_template,
            )
        except Exception as exc:  # no template, or one that refuses this conversation (jinja raises)
            raise InvalidEngineRequest(
                f"The chat template of {self._model_name} does not accept this conversation: {exc}",
                param="messages",
            ) from exc
        # The template writes its own special tokens (BOS and the like).
        ids = self._encode(text, add_special_tokens=False)
        self._refuse_too_long(len(ids) + image_tokens, "messages")
        return BuiltPrompt(ids, text, images=ordered, image_tokens=image_tokens)

    def _images_in_order(
        self, messages: tuple[ChatMessage, ...], images: tuple[ImageInput, ...]
    ) -> tuple[ImageInput, ...]:
        """The images in the order the messages' parts name them (their placeholders' order, which is
        the order the engine takes them in); refused unless each image is named exactly once."""
        named = [part for message in messages for part in message.parts if isinstance(part, int)]
        if not named and not images:
            return ()
        if self.limits.min_image_tokens is None:
            raise InvalidEngineRequest(
                f"The model `{self._model_name}` takes no images; send text only, or name a model that "
                "takes images.",
                param="messages",
                code="model_takes_no_images",
            )
        if sorted(named) != list(range(len(images))):
            raise InvalidEngineRequest(
                f"The messages' parts name images {named[:10]}, but the request sends {len(images)} "
                "images: each must be named exactly once.",
                param="messages",
                code="invalid_value",
            )
        return tuple(images[index] for index in named)

    def _text_prompt(self, text: str) -> BuiltPrompt:
        self._refuse_longer_than_possible(len(text), "prompt")
        ids = self._encode(text, add_special_tokens=True)
        self._refuse_too_long(len(ids), "prompt")
        return BuiltPrompt(ids, text)

    def _token_prompt(self, ids: list[int]) -> BuiltPrompt:
        self._refuse_too_long(len(ids), "prompt")
        vocab = self.limits.vocab_size
        outside = [token for token in ids if not 0 <= token < vocab]
        if outside:
            raise InvalidEngineRequest(
                f"The prompt holds token ids outside the vocabulary of {self._model_name} "
                f"(0 to {vocab - 1}): {outside[:5]}.",
                param="prompt",
                code="invalid_value",
            )
        return BuiltPrompt(ids, self._tokenizer.decode(ids))

    def _encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def _refuse_longer_than_possible(self, characters: int, param: str) -> None:
        """Refuse, without tokenizing, text that cannot fit even at the longest token's length."""
        _refuse(context_length.text_refusal(self.limits, characters, param))

    def _refuse_too_long(self, tokens: int, param: str) -> None:
        _refuse(context_length.prompt_refusal(self.limits, tokens, param))

    def refuse_completion_too_long(self, prompt_tokens: int, max_tokens: int, prompt_param: str) -> None:
        """Refuse `max_tokens` that do not fit after the prompt, as OpenAI and vLLM do (no clamping)."""
        _refuse(context_length.completion_refusal(self.limits, max_tokens, prompt_param, prompt_tokens))


def _refuse(refusal: context_length.Refusal | None) -> None:
    if refusal is not None:
        raise InvalidEngineRequest(refusal.message, param=refusal.param, code=refusal.code)


def longest_token_chars(tokenizer: Any) -> int:
    """An upper bound on the characters one token stands for: its longest vocabulary entry.

    Byte-level vocabularies spell each byte as one character, and SentencePiece spells a space as
    one, so no entry decodes to more characters than it has.
    """
    vocabulary = tokenizer.get_vocab()
    return max((len(entry) for entry in vocabulary), default=1) or 1


def _template_message(message: ChatMessage, *, content_parts: bool) -> dict[str, Any]:
    content = _content_parts(message) if content_parts else message.content
    entry: dict[str, Any] = {"role": message.role, "content": content}
    if message.name is not None:
        entry["name"] = message.name
    if message.tool_call_id is not None:
        entry["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        # Templates read a call's arguments as a mapping (`arguments | tojson`, `arguments.items()`).
        entry["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments(call.arguments)},
            }
            for call in message.tool_calls
        ]
    return entry


def _content_parts(message: ChatMessage) -> list[dict[str, str]]:
    """A message's content as the list of parts vision templates iterate, in OpenAI's order: its
    text parts and image placeholders, or its text as one part. No content (an assistant's tool
    calls) is no part: a template that iterates it finds nothing rather than failing on None."""
    if message.parts:
        return [
            {"type": "image"} if isinstance(part, int) else {"type": "text", "text": part}
            for part in message.parts
        ]
    return [{"type": "text", "text": message.content}] if message.content is not None else []


def _arguments(text: str) -> Any:
    """An earlier call's arguments as the mapping templates expect; text that is not JSON, or JSON
    nested too deeply to parse (a client's `[[[[…`), goes to the template as the text it is."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text
