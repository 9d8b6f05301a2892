"""LiteLLM (`litellm.completion` / `acompletion`) against a live stack as an OpenAI-compatible base:
invoke, stream, and 16 concurrent async streams."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

# Read at import: use the cost map LiteLLM ships instead of fetching one from the network.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm

from tests.clients.conftest import CHAT_PROMPT, MAX_TOKENS, Answer
from tests.support.stack import MODEL

pytestmark = pytest.mark.e2e

CONCURRENT_STREAMS = 16


def request(base_url: str, **options: Any) -> dict[str, Any]:
    """LiteLLM's arguments for the greedy chat request, to the stack as an OpenAI-compatible server."""
    return {
        "model": f"openai/{MODEL}",
        "api_base": base_url,
        "api_key": "unused",
        "messages": [{"role": "user", "content": CHAT_PROMPT}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "num_retries": 0,
        "timeout": 120,
        **options,
    }


def test_completion_is_the_greedy_answer_with_usage(base_url: str, chat_reference: Answer) -> None:
    response = litellm.completion(**request(base_url))
    assert response.choices[0].message.content == chat_reference.text
    assert response.usage.completion_tokens == chat_reference.completion_tokens
    assert response.usage.prompt_tokens == chat_reference.prompt_tokens


def test_stream_has_the_same_text_and_usage(base_url: str, chat_reference: Answer) -> None:
    stream = litellm.completion(**request(base_url, stream=True, stream_options={"include_usage": True}))
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat_reference.text
    usage = [c.usage for c in chunks if getattr(c, "usage", None)]
    assert usage and usage[-1].completion_tokens == chat_reference.completion_tokens


async def test_16_concurrent_async_streams_each_have_the_greedy_answer(
    base_url: str, chat_reference: Answer
) -> None:
    async def one_stream() -> str:
        stream = await litellm.acompletion(**request(base_url, stream=True))
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    texts = await asyncio.gather(*(one_stream() for _ in range(CONCURRENT_STREAMS)))
    assert texts == [chat_reference.text] * CONCURRENT_STREAMS


def test_the_responses_api_is_the_chat_answer_with_usage(base_url: str) -> None:
    # LiteLLM raises `max_output_tokens` to OpenAI's least, 16: the chat answer to compare asks as many.
    reference = litellm.completion(**request(base_url, max_tokens=16))
    response = litellm.responses(
        model=f"openai/{MODEL}",
        api_base=base_url,
        api_key="unused",
        input=CHAT_PROMPT,
        max_output_tokens=16,
        temperature=0,
        timeout=120,
    )
    text = "".join(part.text for item in response.output for part in item.content)
    assert text == reference.choices[0].message.content
    assert response.usage.output_tokens == reference.usage.completion_tokens
    assert response.usage.input_tokens == reference.usage.prompt_tokens
