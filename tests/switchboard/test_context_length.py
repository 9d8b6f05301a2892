"""The context-length refusal, as the front door and a worker's prompt builder both give it."""

from __future__ import annotations

from switchboard.context_length import (
    CONTEXT_LENGTH_EXCEEDED,
    completion_refusal,
    prompt_refusal,
    text_refusal,
)
from switchboard.wire import ModelLimits

LIMITS = ModelLimits(max_model_len=64, vocab_size=1000, max_token_chars=4)


def test_text_longer_than_any_text_of_the_context_is_refused() -> None:
    assert text_refusal(LIMITS, 256, "messages") is None
    refusal = text_refusal(LIMITS, 257, "messages")
    assert refusal is not None
    assert (refusal.param, refusal.code) == ("messages", CONTEXT_LENGTH_EXCEEDED)
    assert refusal.message == (
        "This model's maximum context length is 64 tokens, and the text of `messages` is 257 characters "
        "long, more than any text of that many tokens can be (256 characters). Shorten `messages`."
    )


def test_a_prompt_filling_the_context_is_refused() -> None:
    assert prompt_refusal(LIMITS, 63, "prompt") is None
    refusal = prompt_refusal(LIMITS, 64, "prompt")
    assert refusal is not None
    assert (refusal.param, refusal.code) == ("prompt", CONTEXT_LENGTH_EXCEEDED)
    assert refusal.message == (
        "This model's maximum context length is 64 tokens, and `prompt` alone takes 64 tokens, which "
        "leaves no room for a completion. Shorten `prompt`."
    )


def test_max_tokens_before_the_prompt_is_tokenized_counts_the_prompt_as_one_token() -> None:
    assert completion_refusal(LIMITS, None, "prompt", prompt_tokens=None) is None
    assert completion_refusal(LIMITS, 63, "prompt", prompt_tokens=None) is None
    refusal = completion_refusal(LIMITS, 64, "prompt", prompt_tokens=None)
    assert refusal is not None
    assert (refusal.param, refusal.code) == ("max_tokens", CONTEXT_LENGTH_EXCEEDED)
    assert refusal.message == (
        "This model's maximum context length is 64 tokens, so max_tokens must be below 64 (the prompt "
        "takes at least one token); it is 64."
    )


def test_max_tokens_after_a_tokenized_prompt_must_fit_beside_it() -> None:
    assert completion_refusal(LIMITS, 54, "messages", prompt_tokens=10) is None
    refusal = completion_refusal(LIMITS, 55, "messages", prompt_tokens=10)
    assert refusal is not None
    assert (refusal.param, refusal.code) == ("max_tokens", CONTEXT_LENGTH_EXCEEDED)
    assert refusal.message == (
        "This model's maximum context length is 64 tokens. However, you requested 65 tokens (10 in the "
        "messages, 55 in the completion). Reduce the length of the messages or of the completion "
        "(max_tokens)."
    )
