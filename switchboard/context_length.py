"""The context-length refusal: what cannot fit a model's context, and the words that say so.

The front door checks a request against the limits its model's workers published, before queueing
it; a worker checks the same again when it builds the prompt (the front door may not know the
limits yet, and only the worker knows the prompt's tokens). Both refuse with these messages and
OpenAI's code, so a client reads the same 400 from either.
"""

from __future__ import annotations

from dataclasses import dataclass

from switchboard.wire import ModelLimits

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


@dataclass(frozen=True)
class Refusal:
    """Why a request cannot fit: the message, the request parameter at fault and OpenAI's code."""

    message: str
    param: str
    code: str = CONTEXT_LENGTH_EXCEEDED


def text_refusal(limits: ModelLimits, characters: int, param: str) -> Refusal | None:
    """Refuse, without tokenizing, text longer than any text of `max_model_len` tokens can be."""
    context = limits.max_model_len
    longest_text = context * limits.max_token_chars
    if characters <= longest_text:
        return None
    return Refusal(
        f"This model's maximum context length is {context} tokens, and the text of `{param}` is "
        f"{characters} characters long, more than any text of that many tokens can be ({longest_text} "
        f"characters). Shorten `{param}`.",
        param,
    )


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
