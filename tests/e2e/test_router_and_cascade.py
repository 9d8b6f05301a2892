"""Router-model and cascade pipelines on real engines: the shared stack's (tests/e2e/conftest.py).

The routers are the demo model itself, its answer constrained to the labels "A" and "B" and steered
to "B" by a logit bias; their log-probabilities are the engine's. The cascade's draft is the demo
model: its greedy answers are confident enough (mean token log-probability about -1.8), its answers
sampled at temperature 2 are not (about -6), and those go to the second version.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.support.stack import (
    BROKEN_ROUTER_PIPELINE,
    CASCADE_PIPELINE,
    COLD_VERSION,
    MODEL,
    ROUTER_PIPELINE,
    SECOND_VERSION,
    WARM_ROUTER_PIPELINE,
    Stack,
)

pytestmark = pytest.mark.e2e

PROMPT: Any = [{"role": "user", "content": "Tell me about the sea."}]


def test_a_router_model_chooses_the_target_and_the_answer_names_it_and_counts_the_routers_tokens(
    client: OpenAI,
) -> None:
    direct = client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=8, temperature=0)
    reply = client.chat.completions.with_raw_response.create(
        model=ROUTER_PIPELINE, messages=PROMPT, max_tokens=8, temperature=0
    )
    assert reply.headers["x-switchboard-router"] == MODEL
    assert reply.headers["x-switchboard-router-choice"] == "B"
    assert reply.headers["x-switchboard-model"] == SECOND_VERSION
    answer = reply.parse()
    assert answer.model == SECOND_VERSION and answer.choices[0].message.content
    assert answer.usage is not None and direct.usage is not None
    # The router read the request and the targets' descriptions, and answered one label.
    assert answer.usage.prompt_tokens > direct.usage.prompt_tokens
    assert answer.usage.completion_tokens > 8
    stream = client.chat.completions.create(
        model=ROUTER_PIPELINE, messages=PROMPT, max_tokens=8, temperature=0, stream=True
    )
    chunks = list(stream)
    assert {chunk.model for chunk in chunks} == {SECOND_VERSION}
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == answer.choices[0].message.content
    )


def test_a_warm_target_wins_over_the_routers_cold_choice_and_the_cold_one_is_not_loaded(
    client: OpenAI, stack: Stack
) -> None:
    reply = client.chat.completions.with_raw_response.create(
        model=WARM_ROUTER_PIPELINE, messages=PROMPT, max_tokens=8, temperature=0
    )
    assert reply.headers["x-switchboard-router-choice"] == "A; warm"
    assert reply.parse().model == MODEL
    with httpx.Client(base_url=stack.base_url, timeout=30) as http:
        cold = http.get(f"/admin/models/{COLD_VERSION}").json()
    assert cold["state"] == "cold" and cold["replicas"] == []


def test_a_router_that_cannot_load_leaves_the_choice_to_the_default(client: OpenAI) -> None:
    reply = client.chat.completions.with_raw_response.create(
        model=BROKEN_ROUTER_PIPELINE, messages=PROMPT, max_tokens=8, temperature=0
    )
    assert reply.headers["x-switchboard-router-choice"] == "A; default"
    assert reply.parse().model == MODEL


def test_a_cascade_keeps_a_confident_draft_and_escalates_an_unsure_one(client: OpenAI) -> None:
    kept = client.chat.completions.with_raw_response.create(
        model=CASCADE_PIPELINE, messages=PROMPT, max_tokens=16, temperature=0
    )
    assert kept.headers["x-switchboard-cascade"] == "accepted"
    draft = kept.parse()
    assert draft.model == MODEL and draft.choices[0].logprobs is None
    assert draft.usage is not None and draft.usage.completion_tokens == 16
    escalated = client.chat.completions.with_raw_response.create(
        model=CASCADE_PIPELINE, messages=PROMPT, max_tokens=16, temperature=2.0, seed=1
    )
    assert escalated.headers["x-switchboard-cascade"] == "escalated"
    assert escalated.headers["x-switchboard-draft"] == MODEL
    answer = escalated.parse()
    assert answer.model == SECOND_VERSION
    # The usage counts the draft's tokens and the strong model's.
    assert answer.usage is not None and answer.usage.completion_tokens == 32
    stream = client.chat.completions.create(
        model=CASCADE_PIPELINE,
        messages=PROMPT,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert {chunk.model for chunk in chunks} == {MODEL}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == draft.choices[0].message.content, "the held draft streams as it would have answered"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16
