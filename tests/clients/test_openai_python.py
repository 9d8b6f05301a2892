"""The official `openai` SDK for Python against a live stack: chat, completions, streams with usage,
errors as the SDK's error classes, and request ids (`x-request-id`, the job's id)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import OpenAI

from tests.clients.conftest import CHAT_PROMPT, COMPLETION_PROMPT, MAX_TOKENS, Answer
from tests.support.stack import MODEL

pytestmark = pytest.mark.e2e


@pytest.fixture
def client(base_url: str) -> Iterator[OpenAI]:
    with OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120) as sdk:
        yield sdk


def chat(client: OpenAI, **options: Any) -> Any:
    """The greedy chat request every client makes, with `options` added or overridden."""
    request = {
        "messages": [{"role": "user", "content": CHAT_PROMPT}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    return client.chat.completions.create(model=MODEL, **{**request, **options})


def test_chat_is_the_greedy_answer_with_its_usage_and_request_id(
    client: OpenAI, chat_reference: Answer
) -> None:
    completion = chat(client)
    assert completion.choices[0].message.content == chat_reference.text
    assert completion.choices[0].finish_reason == chat_reference.finish_reason
    assert completion.usage is not None
    assert completion.usage.completion_tokens == chat_reference.completion_tokens
    assert completion.usage.prompt_tokens == chat_reference.prompt_tokens
    assert completion.model == MODEL
    assert completion._request_id, "x-request-id on the response"
    assert completion.id == f"chatcmpl-{completion._request_id}", "the request id is the job's id"


def test_completion_is_the_greedy_answer_with_its_usage_and_request_id(
    client: OpenAI, completion_reference: Answer
) -> None:
    completion = client.completions.create(
        model=MODEL, prompt=COMPLETION_PROMPT, max_tokens=MAX_TOKENS, temperature=0
    )
    assert completion.choices[0].text == completion_reference.text
    assert completion.usage is not None
    assert completion.usage.completion_tokens == completion_reference.completion_tokens
    assert completion._request_id
    assert completion.id == f"cmpl-{completion._request_id}"


def test_completion_without_max_tokens_stops_at_16_as_openai(client: OpenAI) -> None:
    completion = client.completions.create(model=MODEL, prompt=COMPLETION_PROMPT, temperature=0)
    assert completion.usage is not None
    assert completion.usage.completion_tokens <= 16
    if completion.choices[0].finish_reason == "length":
        assert completion.usage.completion_tokens == 16


def test_chat_stream_has_the_same_text_its_usage_and_request_id(
    client: OpenAI, chat_reference: Answer
) -> None:
    stream = chat(client, stream=True, stream_options={"include_usage": True})
    request_id = stream.response.headers.get("x-request-id")
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat_reference.text
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices, "the last chunk carries usage only"
    assert usage.completion_tokens == chat_reference.completion_tokens
    assert usage.prompt_tokens == chat_reference.prompt_tokens
    assert request_id, "x-request-id on a streamed response too"
    assert {c.id for c in chunks} == {f"chatcmpl-{request_id}"}


def test_completion_stream_has_the_same_text_and_usage(client: OpenAI, completion_reference: Answer) -> None:
    stream = client.completions.create(
        model=MODEL,
        prompt=COMPLETION_PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == completion_reference.text
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == completion_reference.completion_tokens


def test_unknown_model_is_the_sdk_not_found_error_with_a_request_id(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert raised.value.status_code == 404
    assert raised.value.code == "model_not_found"
    assert raised.value.request_id, "x-request-id on an error response too"


def test_bad_parameter_is_the_sdk_bad_request_error_naming_it(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        chat(client, temperature=5)
    assert raised.value.status_code == 400
    assert raised.value.param == "temperature"
    assert raised.value.request_id
