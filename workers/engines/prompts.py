"""From a request to the prompt's token ids: the chat template, tokenization, and the length checks.

Engine-agnostic: it needs only the model's Hugging Face tokenizer. Building a prompt can take long
for a long one (a template over many messages, a tokenizer over megabytes), so engines build all
but short ones (`builds_quickly`) off their event loop; it refuses what cannot fit before tokenizing it.
"""

from __future__ import annotations

import json
from typing import Any

from switchboard import context_length
from switchboard.wire import ChatMessage, ModelLimits
from workers.engines.base import EngineRequest, InvalidEngineRequest

# A prompt of up to this many characters is built in a few dozen microseconds, less than handing
# it to a thread and back costs; longer ones are built off the event loop.
QUICK_BUILD_MAX_CHARS = 4096


def builds_quickly(request: EngineRequest) -> bool:
    """Whether the request's prompt is short enough to build on the event loop that drives every stream."""
    chars = len(request.tools or "") + len(request.continuation or "")
    for message in request.messages or ():
        chars += len(message.content or "") + sum(len(call.arguments) for call in message.tool_calls)
    if request.prompt is not None:
        chars += len(request.prompt)  # characters, or token ids (cheaper still)
    return chars <= QUICK_BUILD_MAX_CHARS


class BuiltPrompt:
    """A request's prompt as the engine takes it, and as text (what `echo` repeats).

    A continued request's `token_ids` end with the `continuation_tokens` of its continuation,
    which are completion tokens, not prompt tokens.
    """

    def __init__(self, token_ids: list[int], text: str, continuation_tokens: int = 0) -> None:
        self.token_ids = token_ids
        self.text = text
        self.continuation_tokens = continuation_tokens

    @property
    def prompt_tokens(self) -> int:
        """The tokens of the prompt alone."""
        return len(self.token_ids) - self.continuation_tokens


class PromptBuilder:
    """Turns requests into token ids with one model's tokenizer and chat template."""

    def __init__(self, tokenizer: Any, *, model_name: str, max_model_len: int, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self._model_name = model_name
        self.limits = ModelLimits(
            max_model_len=max_model_len,
            vocab_size=vocab_size,
            max_token_chars=longest_token_chars(tokenizer),
        )

    def build(self, request: EngineRequest) -> BuiltPrompt:
        """The prompt of `request`, refused (InvalidEngineRequest) if it cannot fit the context.

        A continued request's prompt is followed by its continuation's tokens (no special tokens).
        """
        if request.messages is not None:
            prompt = self._chat_prompt(request.messages, request.tools)
        elif isinstance(request.prompt, tuple):
            prompt = self._token_prompt(list(request.prompt))
        else:
            prompt = self._text_prompt(request.prompt or "")
        if not request.continuation:
            return prompt
        param = "messages" if request.messages is not None else "prompt"
        continued = self._encode(request.continuation, add_special_tokens=False)
        self._refuse_too_long(len(prompt.token_ids) + len(continued), param)
        return BuiltPrompt(prompt.token_ids + continued, prompt.text, continuation_tokens=len(continued))

    def _chat_prompt(self, messages: tuple[ChatMessage, ...], tools: str | None) -> BuiltPrompt:
        self._refuse_longer_than_possible(sum(len(m.content or "") for m in messages), "messages")
        conversation = [_template_message(m) for m in messages]
        try:
            text = self._tokenizer.apply_chat_template(
                conversation,
                tools=json.loads(tools) if tools else None,
                add_generation_prompt=True,
                tokenize=False,
            )
        except Exception as exc:  # no template, or one that refuses this conversation (jinja raises)
            raise InvalidEngineRequest(
                f"The chat template of {self._model_name} does not accept this conversation: {exc}",
                param="messages",
            ) from exc
        # The template writes its own special tokens (BOS and the like).
        ids = self._encode(text, add_special_tokens=False)
        self._refuse_too_long(len(ids), "messages")
        return BuiltPrompt(ids, text)

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


def _template_message(message: ChatMessage) -> dict[str, Any]:
    entry: dict[str, Any] = {"role": message.role, "content": message.content}
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


def _arguments(text: str) -> Any:
    """An earlier call's arguments as the mapping templates expect; text that is not JSON, or JSON
    nested too deeply to parse (a client's `[[[[…`), goes to the template as the text it is."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text
