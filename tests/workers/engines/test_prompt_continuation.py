"""Prompts built with the demo model's real tokenizer: a continued request goes on after its text."""

from __future__ import annotations

from typing import Any

import pytest

from switchboard.wire import ChatMessage, SamplingParams
from workers.engines.base import EngineRequest, InvalidEngineRequest
from workers.engines.prompts import PromptBuilder

pytest.importorskip("transformers")


def request(**fields: Any) -> EngineRequest:
    return EngineRequest(request_id="r", sampling=SamplingParams(max_tokens=8), **fields)


def test_a_continued_prompt_is_the_prompt_then_the_text_already_sent(
    builder: PromptBuilder, tokenizer: Any
) -> None:
    plain = builder.build(request(prompt="the cat"))
    continued = builder.build(request(prompt="the cat", continuation=" sat on"))
    sent = tokenizer.encode(" sat on", add_special_tokens=False)
    assert continued.token_ids == plain.token_ids + sent
    assert continued.continuation_tokens == len(sent) > 0
    assert continued.prompt_tokens == len(plain.token_ids), "the continuation counts as completion"
    assert continued.text == plain.text


def test_a_continued_chat_follows_the_template_with_the_text_already_sent(
    builder: PromptBuilder, tokenizer: Any
) -> None:
    messages = (ChatMessage(role="user", content="hi"),)
    plain = builder.build(request(messages=messages))
    continued = builder.build(request(messages=messages, continuation="hello there"))
    assert continued.token_ids == plain.token_ids + tokenizer.encode("hello there", add_special_tokens=False)
    assert continued.prompt_tokens == len(plain.token_ids)


def test_token_prompts_continue_too_and_no_continuation_changes_nothing(builder: PromptBuilder) -> None:
    ids = builder.build(request(prompt="abc")).token_ids
    assert builder.build(request(prompt=tuple(ids))).continuation_tokens == 0
    continued = builder.build(request(prompt=tuple(ids), continuation="d"))
    assert continued.token_ids[: len(ids)] == ids and continued.continuation_tokens >= 1


def test_a_continuation_that_fills_the_context_is_refused(builder: PromptBuilder) -> None:
    with pytest.raises(InvalidEngineRequest) as refused:
        builder.build(request(prompt="a", continuation="word " * builder.limits.max_model_len))
    assert refused.value.code == "context_length_exceeded"
