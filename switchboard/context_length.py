"""The context-length refusal: what cannot fit a model's context, and the words that say so.

The front door checks a request against the limits its model's workers published, before queueing
it; a worker checks the same again when it builds the prompt (the front door may not know the
limits yet, and only the worker knows the prompt's tokens). Both refuse with these messages and
OpenAI's code, so a client reads the same 400 from either.

Before tokenizing, only characters are known, and they bound tokens from one side only: no token
stands for more than `max_token_chars` characters, so a text has at least `characters /
max_token_chars` tokens, but may have up to one per character. A text is therefore refused when it
is longer than `max_model_len * max_token_chars` characters, and the characters counted must be no
more than the prompt will hold: a count that is too high refuses a request that fits. So a chat's
count (`least_chat_chars`) holds only what its chat template certainly writes, never an estimate
of what it may add (role markers, names, call ids: templates differ, and many drop them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from switchboard.wire import ChatMessage, ModelLimits, ToolCall

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


@dataclass(frozen=True)
class Refusal:
    """Why a request cannot fit: the message, the request parameter at fault and OpenAI's code."""

    message: str
    param: str
    code: str = CONTEXT_LENGTH_EXCEEDED


def text_refusal(
    limits: ModelLimits, characters: int, param: str, *, text_of: str | None = None
) -> Refusal | None:
    """Refuse, without tokenizing, text longer than any text of `max_model_len` tokens can be.

    `characters` must be no more than the prompt holds (see the module's docstring); `text_of` names
    the request's parts they were counted from, if more than `param`."""
    context = limits.max_model_len
    longest_text = context * limits.max_token_chars
    if characters <= longest_text:
        return None
    parts = text_of or f"`{param}`"
    return Refusal(
        f"This model's maximum context length is {context} tokens, and the text of {parts} is "
        f"{characters} characters long, more than any text of that many tokens can be ({longest_text} "
        f"characters). Shorten {parts}.",
        param,
    )


def least_chat_chars(
    messages: Iterable[ChatMessage], tools: str | None, *, template_renders_tools: bool
) -> int:
    """The characters a chat template certainly writes for `messages` and `tools` (OpenAI's list, as
    JSON text), whatever else it writes around them.

    Every template writes each message's content. A template that renders tools
    (`template_renders_tools`: a model with a tool-call parser, whose format its template teaches)
    also writes each earlier call's function name and arguments, and each tool's name, description
    and parameters; in JSON (escaped, so never shorter) or in a markup of its own (XML-like tags,
    Python-like calls), but always every key and every string value of the arguments and of the
    parameters' properties: those are counted, as the text they decode to. What no template is
    bound to write is not counted: names, call ids, role markers, JSON's punctuation, numbers.
    """
    total = 0
    for message in messages:
        total += len(message.content or "")
        if template_renders_tools:
            total += sum(_call_chars(call) for call in message.tool_calls)
    if template_renders_tools and tools:
        total += sum(_tool_chars(tool) for tool in json.loads(tools))
    return total


def _call_chars(call: ToolCall) -> int:
    """An earlier call: its function's name and its arguments as a template renders them."""
    # Parsed exactly as the worker parses them for the template (`workers.engines.prompts`).
    try:
        arguments = json.loads(call.arguments)
    except ValueError:  # not JSON: the template gets the text itself
        return len(call.name) + len(call.arguments)
    except RecursionError:  # nested too deep to parse: no template renders it; count nothing
        return len(call.name)
    return len(call.name) + json_text_chars(arguments)


def _tool_chars(tool: Any) -> int:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict):
        return 0
    parameters = function.get("parameters")
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    return sum(
        len(text) for text in (function.get("name"), function.get("description")) if isinstance(text, str)
    ) + json_text_chars(properties)


def json_text_chars(value: Any) -> int:
    """The characters of every key and string value in a parsed JSON value (iteratively: a value
    may nest deeper than Python's recursion goes)."""
    total, pending = 0, [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            total += sum(len(key) for key in item if isinstance(key, str))
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return total


def prompt_refusal(limits: ModelLimits, prompt_tokens: int, param: str) -> Refusal | None:
    """Refuse a prompt that fills the whole context, leaving no room for a completion."""
    context = limits.max_model_len
    if prompt_tokens < context:
        return None
    return Refusal(
        f"This model's maximum context length is {context} tokens, and `{param}` alone takes "
        f"{prompt_tokens} tokens, which leaves no room for a completion. Shorten `{param}`.",
        param,
    )


def completion_refusal(
    limits: ModelLimits, max_tokens: int | None, prompt_param: str, prompt_tokens: int | None
) -> Refusal | None:
    """Refuse `max_tokens` that do not fit after the prompt, as OpenAI and vLLM do (no clamping).

    `prompt_tokens` is None where the prompt is not tokenized yet (the front door): the prompt then
    counts as its least, one token. No `max_tokens` (None) always fits.
    """
    context = limits.max_model_len
    if max_tokens is None:
        return None
    if prompt_tokens is None:
        if max_tokens < context:
            return None
        return Refusal(
            f"This model's maximum context length is {context} tokens, so max_tokens must be below "
            f"{context} (the prompt takes at least one token); it is {max_tokens}.",
            "max_tokens",
        )
    if prompt_tokens + max_tokens <= context:
        return None
    return Refusal(
        f"This model's maximum context length is {context} tokens. However, you requested "
        f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {prompt_param}, {max_tokens} in the "
        f"completion). Reduce the length of the {prompt_param} or of the completion (max_tokens).",
        "max_tokens",
    )
