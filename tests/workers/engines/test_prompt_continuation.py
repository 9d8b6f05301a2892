"""Prompts built with the demo model's real tokenizer: a continued request goes on after its text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from switchboard.local.demo_model import build_demo_model
from switchboard.wire import ChatMessage, SamplingParams
from workers.engines.base import EngineRequest, InvalidEngineRequest
from workers.engines.prompts import PromptBuilder

transformers = pytest.importorskip("transformers")

MAX_MODEL_LEN = 64


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model_dir: Path = build_demo_model(tmp_path_factory.mktemp("demo") / "model")
    return transformers.AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def builder(tokenizer: Any) -> PromptBuilder:
    return PromptBuilder(tokenizer, model_name="demo", max_model_len=MAX_MODEL_LEN, vocab_size=len(tokenizer))


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
        builder.build(request(prompt="a", continuation="word " * MAX_MODEL_LEN))
    assert refused.value.code == "context_length_exceeded"
