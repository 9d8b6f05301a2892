"""LangChain's `ChatOpenAI` (langchain-openai) against a live stack: invoke, stream, structured output."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from tests.clients.conftest import CHAT_PROMPT, MAX_TOKENS, Answer
from tests.support.stack import MODEL

pytestmark = pytest.mark.e2e


class Person(BaseModel):
    """A structured answer the server holds the model to (JSON-schema guided decoding); the short
    pattern lets even the demo model's random weights finish it within a few tokens."""

    name: str = Field(pattern="^[a-z]{1,10}$")
    age: int


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


def test_structured_output_is_a_valid_pydantic_model(base_url: str) -> None:
    # Sampled with a seed, as the surface test of JSON schemas does: greedy decoding of random
    # weights may pick digits for the age until max_tokens.
    model = chat_model(base_url, temperature=1.0, seed=11, max_completion_tokens=60)
    structured = model.with_structured_output(Person, method="json_schema", include_raw=True)
    reply = structured.invoke("Who are you? Answer in JSON.")
    assert reply["parsing_error"] is None
    person = reply["parsed"]
    assert isinstance(person, Person)
    assert reply["raw"].response_metadata["finish_reason"] == "stop"
    assert json.loads(str(reply["raw"].content)) == person.model_dump()


def test_the_responses_api_gives_the_same_answer_invoked_and_streamed(
    base_url: str, chat_reference: Answer
) -> None:
    model = chat_model(base_url, use_responses_api=True)
    message = model.invoke(CHAT_PROMPT)
    assert message.text == chat_reference.text
    assert message.usage_metadata is not None
    assert message.usage_metadata["output_tokens"] == chat_reference.completion_tokens
    assert message.usage_metadata["input_tokens"] == chat_reference.prompt_tokens
    assert message.response_metadata["id"].startswith("resp_")
    chunks = list(model.stream(CHAT_PROMPT))
    assert "".join(chunk.text for chunk in chunks) == chat_reference.text
    usage = [chunk.usage_metadata for chunk in chunks if chunk.usage_metadata]
    assert [u["output_tokens"] for u in usage] == [chat_reference.completion_tokens]
