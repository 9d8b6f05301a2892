"""LangChain's `ChatOpenAI` (langchain-openai) against a live stack: invoke, stream, structured output."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from tests.clients.conftest import CHAT_PROMPT, MAX_TOKENS, Answer
from tests.support.stack import MODEL

pytestmark = pytest.mark.e2e


class Verdict(BaseModel):
    """A structured answer the model is held to by the server's JSON-schema guided decoding."""

    answer: str


def chat_model(base_url: str, **options: Any) -> ChatOpenAI:
    """The greedy chat model every test uses, with `options` added or overridden."""
    settings = {"temperature": 0, "max_completion_tokens": MAX_TOKENS, "max_retries": 0, "timeout": 120}
    return ChatOpenAI(model=MODEL, base_url=base_url, api_key="unused", **{**settings, **options})


def test_invoke_is_the_greedy_answer_with_usage(base_url: str, chat_reference: Answer) -> None:
    message = chat_model(base_url).invoke(CHAT_PROMPT)
    assert message.content == chat_reference.text
    assert message.usage_metadata is not None
    assert message.usage_metadata["output_tokens"] == chat_reference.completion_tokens
    assert message.usage_metadata["input_tokens"] == chat_reference.prompt_tokens
    assert message.response_metadata["finish_reason"] == chat_reference.finish_reason


def test_stream_has_the_same_text_and_usage(base_url: str, chat_reference: Answer) -> None:
    chunks = list(chat_model(base_url, stream_usage=True).stream(CHAT_PROMPT))
    assert "".join(str(chunk.content) for chunk in chunks) == chat_reference.text
    usage = [chunk.usage_metadata for chunk in chunks if chunk.usage_metadata]
    assert [u["output_tokens"] for u in usage] == [chat_reference.completion_tokens]


def test_structured_output_is_a_filled_model(base_url: str) -> None:
    # Enough tokens for the closing brace of a JSON object the tiny model fills with random text.
    model = chat_model(base_url, max_completion_tokens=200)
    structured = model.with_structured_output(Verdict, method="json_schema")
    verdict = structured.invoke("Answer in JSON: is the sky blue?")
    assert isinstance(verdict, Verdict)
    assert isinstance(verdict.answer, str)
