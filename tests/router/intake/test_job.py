"""router.intake.job: validated OpenAI requests into Jobs, the only thing a worker sees."""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec
import pytest

from router.intake.job import chat_job, completion_job, prompts_of, sampling_params
from router.openai.chat import ChatCompletionRequest
from router.openai.completions import CompletionRequest
from switchboard.wire import ChatMessage, StructuredOutput, ToolCall, encode, job_decoder

USER = {"role": "user", "content": "Hi"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def chat(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [USER], **fields}
    return msgspec.json.decode(msgspec.json.encode(body), type=ChatCompletionRequest)


def completion(**fields: Any) -> CompletionRequest:
    body = {"model": "m", "prompt": "Once", **fields}
    return msgspec.json.decode(msgspec.json.encode(body), type=CompletionRequest)


def test_chat_job_carries_the_request() -> None:
    before = time.time()
    job = chat_job(chat(temperature=0.7, max_tokens=9, stop="END", n=3, seed=5), timeout_s=30.0, tenant="t")
    assert job.model == "m"
    assert job.tenant == "t"
    assert job.prompts is None
    assert job.messages == (ChatMessage(role="user", content="Hi"),)
    assert before <= job.created <= time.time()
    assert job.deadline == pytest.approx(job.created + 30.0)
    sampling = job.sampling
    assert (sampling.temperature, sampling.max_tokens, sampling.stop, sampling.n, sampling.seed) == (
        0.7,
        9,
        ("END",),
        3,
        5,
    )
    assert sampling.logprobs is None
    assert sampling.structured is None
    assert job.tools is None
    assert job.parse_tool_calls is False
    # What crosses Redis comes back the same.
    assert job_decoder.decode(encode(job)) == job


def test_jobs_have_distinct_ids() -> None:
    assert chat_job(chat(), timeout_s=1).id != chat_job(chat(), timeout_s=1).id


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    assert chat_job(chat(max_tokens=50, max_completion_tokens=7), timeout_s=1).sampling.max_tokens == 7
    assert chat_job(chat(max_tokens=50), timeout_s=1).sampling.max_tokens == 50


@pytest.mark.parametrize(
    ("fields", "logprobs"),
    [
        ({}, None),
        ({"logprobs": False}, None),
        ({"logprobs": True}, 0),
        ({"logprobs": True, "top_logprobs": 0}, 0),
        ({"logprobs": True, "top_logprobs": 20}, 20),
    ],
)
def test_chat_logprobs_map_to_sampling(fields: dict[str, Any], logprobs: int | None) -> None:
    assert chat_job(chat(**fields), timeout_s=1).sampling.logprobs == logprobs


@pytest.mark.parametrize(("given", "logprobs"), [(None, None), (0, 0), (5, 5)])
def test_completion_logprobs_is_the_count(given: int | None, logprobs: int | None) -> None:
    fields = {} if given is None else {"logprobs": given}
    assert completion_job(completion(**fields), timeout_s=1).sampling.logprobs == logprobs


def test_top_p_zero_is_greedy() -> None:
    sampling = chat_job(chat(temperature=1.5, top_p=0.0), timeout_s=1).sampling
    assert (sampling.temperature, sampling.top_p) == (0.0, None)
    sampling = chat_job(chat(temperature=1.5, top_p=0.5), timeout_s=1).sampling
    assert (sampling.temperature, sampling.top_p) == (1.5, 0.5)
    sampling = completion_job(completion(top_p=0), timeout_s=1).sampling
    assert (sampling.temperature, sampling.top_p) == (0.0, None)


def test_every_sampling_field_is_carried() -> None:
    request = completion(
        max_tokens=12,
        temperature=0.3,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        seed=-3,
        stop=["a", "", "b"],
        n=2,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.1,
        min_tokens=2,
        logit_bias={"17": -100, "3": 4.5},
        echo=True,
    )
    sampling = completion_job(request, timeout_s=1).sampling
    assert sampling.max_tokens == 12
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p) == (0.3, 0.9, 40, 0.05)
    assert sampling.seed == -3
    assert sampling.stop == ("a", "b")
    assert sampling.n == 2
    assert (sampling.presence_penalty, sampling.frequency_penalty, sampling.repetition_penalty) == (
        0.5,
        -0.5,
        1.1,
    )
    assert sampling.min_tokens == 2
    assert sampling.logit_bias == {17: -100.0, 3: 4.5}
    assert sampling.echo is True


def test_sampling_params_leaves_unset_fields_to_the_engine() -> None:
    sampling = sampling_params(completion(), max_tokens=None, logprobs=None)
    for field in ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "logit_bias"):
        assert getattr(sampling, field) is None, field
    assert (sampling.stop, sampling.n, sampling.echo) == ((), 1, False)


def test_response_format_json_object() -> None:
    structured = chat_job(chat(response_format={"type": "json_object"}), timeout_s=1).sampling.structured
    assert structured == StructuredOutput(json_object=True)


def test_response_format_json_schema_is_carried_as_text() -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    format_ = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    structured = chat_job(chat(response_format=format_), timeout_s=1).sampling.structured
    assert structured is not None and structured.json_schema is not None
    assert json.loads(structured.json_schema) == schema
    assert not structured.json_object


def test_response_format_json_schema_without_schema_is_an_object() -> None:
    format_ = {"type": "json_schema", "json_schema": {"name": "answer"}}
    structured = chat_job(chat(response_format=format_), timeout_s=1).sampling.structured
    assert structured is not None and structured.json_schema is not None
    assert json.loads(structured.json_schema) == {"type": "object"}


def test_response_format_text_is_no_constraint() -> None:
    assert chat_job(chat(response_format={"type": "text"}), timeout_s=1).sampling.structured is None


@pytest.mark.parametrize(
    ("constraints", "expected"),
    [
        ({"regex": "[0-9]+"}, StructuredOutput(regex="[0-9]+")),
        ({"choice": ["yes", "no"]}, StructuredOutput(choice=("yes", "no"))),
        ({"grammar": "root ::= 'a'"}, StructuredOutput(grammar="root ::= 'a'")),
        ({"json_object": True}, StructuredOutput(json_object=True)),
        ({"json": {"type": "integer"}}, StructuredOutput(json_schema='{"type":"integer"}')),
    ],
)
def test_structured_outputs_extension(constraints: dict[str, Any], expected: StructuredOutput) -> None:
    assert chat_job(chat(structured_outputs=constraints), timeout_s=1).sampling.structured == expected
    assert (
        completion_job(completion(structured_outputs=constraints), timeout_s=1).sampling.structured
        == expected
    )


def test_a_tool_choice_constraint_comes_first() -> None:
    forced = StructuredOutput(json_schema='{"type":"array"}')
    job = chat_job(chat(response_format={"type": "json_object"}), timeout_s=1, structured=forced)
    assert job.sampling.structured == forced


def test_content_parts_are_flattened() -> None:
    parts = [
        {"type": "text", "text": "Hello, "},
        {"type": "refusal", "refusal": "no. "},
        {"type": "text", "text": "world"},
    ]
    job = chat_job(chat(messages=[{"role": "user", "content": parts, "name": "ann"}]), timeout_s=1)
    assert job.messages == (ChatMessage(role="user", content="Hello, no. world", name="ann"),)


def test_tool_calls_and_answers_are_carried() -> None:
    messages = [
        USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                },
                {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "cold"},
    ]
    job = chat_job(chat(messages=messages), timeout_s=1)
    assert job.messages is not None
    assistant, tool = job.messages[1:]
    assert assistant == ChatMessage(
        role="assistant",
        content=None,
        tool_calls=(
            ToolCall(id="call_a", name="get_weather", arguments='{"city":"Oslo"}'),
            ToolCall(id="call_b", name="get_time", arguments="{}"),
        ),
    )
    assert tool == ChatMessage(role="tool", content="cold", tool_call_id="call_a")


def test_tools_travel_as_openai_json_text() -> None:
    bare = {"type": "function", "function": {"name": "get_time"}}
    job = chat_job(chat(tools=[WEATHER, bare]), timeout_s=1, parse_tool_calls=True)
    assert job.tools is not None
    assert json.loads(job.tools) == [WEATHER, bare]
    assert job.parse_tool_calls is True


@pytest.mark.parametrize(
    ("prompt", "prompts"),
    [
        ("text", ("text",)),
        ([1, 2, 3], ((1, 2, 3),)),
        (["a", "b"], ("a", "b")),
        ([[1, 2], [3]], ((1, 2), (3,))),
        (["a", [4, 5]], ("a", (4, 5))),
    ],
)
def test_prompts_of(prompt: Any, prompts: tuple[Any, ...]) -> None:
    assert prompts_of(prompt) == prompts
    job = completion_job(completion(prompt=prompt), timeout_s=1)
    assert job.prompts == prompts
    assert job.messages is None
    assert job_decoder.decode(encode(job)).prompts == prompts


def test_each_key_salts_its_jobs_prefix_cache_and_a_clients_salt_only_follows_the_keys() -> None:
    alice, bob = "a" * 64, "b" * 64  # keys' identities (their secrets' SHA-256)
    salted = chat_job(chat(), timeout_s=30.0, owner=alice)
    assert salted.cache_salt is not None and len(salted.cache_salt) == 32
    # One key's requests share a salt (and so their prefixes); another key's never meets it.
    assert chat_job(chat(), timeout_s=30.0, owner=alice).cache_salt == salted.cache_salt
    assert completion_job(completion(), timeout_s=30.0, owner=alice).cache_salt == salted.cache_salt
    assert chat_job(chat(), timeout_s=30.0, owner=bob).cache_salt != salted.cache_salt
    assert alice not in salted.cache_salt  # a digest of the identity, not the identity itself
    # A client's own salt (vLLM's extension) follows its key's, never replaces it: bob naming
    # alice's salt as his own still has his key's before it.
    assert (
        chat_job(chat(cache_salt="s1"), timeout_s=30.0, owner=alice).cache_salt == f"{salted.cache_salt}:s1"
    )
    forged = chat_job(chat(cache_salt=salted.cache_salt), timeout_s=30.0, owner=bob).cache_salt
    assert forged is not None and not forged.startswith(salted.cache_salt)
    # With keys off there is one shared cache, the client's salt as vLLM takes it.
    assert chat_job(chat(), timeout_s=30.0).cache_salt is None
    assert completion_job(completion(cache_salt="s1"), timeout_s=30.0).cache_salt == "s1"
    # Carried through Redis as it is.
    assert job_decoder.decode(encode(salted)).cache_salt == salted.cache_salt


@pytest.mark.parametrize("salt", ["", "a/b", "a@b", "a\\b", "x" * 96])
def test_a_client_salt_vllm_would_refuse_is_refused_at_its_field(salt: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=r"\$\.cache_salt"):
        chat(cache_salt=salt)
