"""Hostile request bodies against the running front door: every one a 4xx in OpenAI's error shape.

Property-based (hypothesis), plus the concrete cases that once misbehaved. The front door runs on a
real port against the session's Redis (`live_front_door`), and a scripted worker answers every job
it takes, so after each hostile body a good request must still get a real answer. One model has its
limits published (as a worker writes them after a load) and one has none yet, so both the front
door's own context checks and the path that leaves them to a worker are driven.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchboard.config import FrontDoorConfig
from switchboard.local.redis_server import PrivateRedis
from tests.support.front_door_harness import MODEL
from tests.support.live_front_door import (
    CHAT,
    COMPLETIONS,
    GOOD,
    LIMITS,
    UNMEASURED,
    LiveFrontDoor,
    Raw,
    assert_answered,
    error_of,
    post,
    to_json,
)

ENDPOINTS = [CHAT, COMPLETIONS]
# The front door's default request body limit (router.max_body_bytes).
BODY_LIMIT = FrontDoorConfig().max_body_bytes

# Valid requests setting (nearly) every field, each of which the mutation property spoils in turn.
CHAT_BASE: dict[str, Any] = {
    "model": MODEL,
    "messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "text", "text": "What is 1 + 1?"}], "name": "ada"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "2"},
    ],
    "max_tokens": 3,
    "max_completion_tokens": 3,
    "temperature": 0.5,
    "top_p": 0.9,
    "n": 1,
    "seed": 7,
    "stop": ["\n", "END"],
    "stream": False,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "logit_bias": {"5": -1.5},
    "user": "someone",
    "top_k": 5,
    "min_p": 0.1,
    "repetition_penalty": 1.1,
    "min_tokens": 1,
    "logprobs": True,
    "top_logprobs": 2,
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": {"type": "object"}},
    },
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Adds.",
                "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
            },
        }
    ],
    "tool_choice": "none",
    "parallel_tool_calls": True,
    "metadata": {"team": "a"},
    "store": False,
    "service_tier": "auto",
    "modalities": ["text"],
}
COMPLETION_BASE: dict[str, Any] = {
    "model": MODEL,
    "prompt": ["Once upon", [1, 2, 3]],
    "max_tokens": 3,
    "temperature": 0.5,
    "top_p": 0.9,
    "n": 2,
    "best_of": 2,
    "seed": 7,
    "stop": "END",
    "stream": False,
    "presence_penalty": 0.1,
    "frequency_penalty": 0.1,
    "logit_bias": {"7": 2},
    "user": "someone",
    "echo": False,
    "logprobs": 1,
    "suffix": "",
    "top_k": 5,
    "min_p": 0.1,
    "repetition_penalty": 1.1,
    "min_tokens": 1,
}
BASES = {CHAT: CHAT_BASE, COMPLETIONS: COMPLETION_BASE}

PROPERTY = settings(
    max_examples=100,
    deadline=None,
    database=None,  # nothing written into the work tree; a failure prints its own reproduction
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def front_door(redis_server: PrivateRedis) -> Iterator[httpx.Client]:
    with LiveFrontDoor(redis_server.url) as live, httpx.Client(base_url=live.base_url, timeout=30) as client:
        yield client


def still_answers(client: httpx.Client, path: str) -> None:
    """A good request after a hostile one gets the worker's answer."""
    assert_answered(post(client, path, GOOD[path]), path)


def root_of(param: str) -> str:
    """The top-level field a `param` such as `messages[1].content[0].type` lies in."""
    return re.split(r"[.\[]", param, maxsplit=1)[0]


# --- strategies -----------------------------------------------------------------------------------

BOUNDARY_INTS = [0, -1, 1, 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30, -(10**30)]  # fmt: skip
# Numbers no float or 64-bit integer holds, and strings that are not UTF-8 or not Unicode at all.
RAW_NUMBERS = [b"1e999", b"-1e999", b"1e-999", b"NaN", b"Infinity", b"-0", b"1" * 4301, b"0.5e1"]
RAW_STRINGS = [b'"\\ud800"', b'"\\udc00x"', b'"caf\xe9"', b'"\xed\xa0\x80"', b'"\xff\xfe"', b'"a\\u0000b"']
RAW_TOKENS = [Raw(token) for token in [*RAW_NUMBERS, *RAW_STRINGS]]
WEIRD_TEXT = ["", " ", "\x00", "\u2028", "é", "𐀀", "null", "-5", "1e999", "image_url", "function"]
# Object keys that look like token ids (`logit_bias`) without being ones, or are ones no engine has.
WEIRD_KEYS = ["5", "-1", " 5", "05", "+5", "1e3", "٥", "2147483648", "9" * 20, "1" * 5000]
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from(WEIRD_TEXT),
)
# Python's floats inf and nan are written `Infinity` and `NaN`, which are not JSON.
scalars = json_scalars | st.floats()
# The values that once broke the front door are drawn as often as all ordinary scalars together.
leaves = st.one_of(scalars, st.sampled_from(BOUNDARY_INTS), st.sampled_from(RAW_TOKENS))
object_keys = st.text(max_size=8) | st.sampled_from(WEIRD_KEYS)


def json_of(leaf: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaf,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(object_keys, inner, max_size=4),
        max_leaves=12,
    )


plain_json = json_of(st.one_of(json_scalars, st.sampled_from(BOUNDARY_INTS)))
hostile_json = json_of(leaves)


def field_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key and index under `value`, outermost first."""
    children = (
        value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    )
    found: list[tuple[Any, ...]] = []
    for key, child in children:
        found += [(*prefix, key), *field_paths(child, (*prefix, key))]
    return found


@st.composite
def mutated(draw: st.DrawFn, path: str) -> tuple[dict[str, Any], str]:
    """A valid request with one field (at any depth) replaced, removed or given an unknown sibling."""
    body = copy.deepcopy(BASES[path])
    body["model"] = draw(st.sampled_from([MODEL, UNMEASURED]))
    # Each top-level field as likely as any other, however much lies under it.
    field = draw(st.sampled_from(sorted(body)))
    where = (field, *draw(st.sampled_from([(), *field_paths(body[field])])))
    parent = body
    for key in where[:-1]:
        parent = parent[key]
    action = draw(st.sampled_from(["replace", "replace", "replace", "remove", "add"]))
    if action == "remove" and isinstance(parent, dict):
        del parent[where[-1]]
    elif action == "add" and isinstance(parent[where[-1]], dict):
        parent[where[-1]][draw(object_keys)] = draw(hostile_json)
    else:
        parent[where[-1]] = draw(leaves | hostile_json)
    return body, field


NUMBER_FIELDS = {
    CHAT: ["max_completion_tokens", "top_logprobs"],
    COMPLETIONS: ["logprobs", "best_of"],
}
for _fields in NUMBER_FIELDS.values():
    _fields += [
        "max_tokens", "temperature", "top_p", "n", "seed", "presence_penalty", "frequency_penalty",
        "top_k", "min_p", "repetition_penalty", "min_tokens", "logit_bias key", "logit_bias value",
    ]  # fmt: skip
NOT_JSON = {b"NaN", b"Infinity"}
numbers = st.one_of(
    st.integers(-3, 300),
    st.integers(),
    st.sampled_from(BOUNDARY_INTS),
    st.floats(),
    st.sampled_from([Raw(token) for token in RAW_NUMBERS]),
)


# --- properties -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ENDPOINTS)
@PROPERTY
@given(body=hostile_json)
def test_any_json_value_as_a_body_is_a_4xx(front_door: httpx.Client, path: str, body: Any) -> None:
    error_of(post(front_door, path, body))
    still_answers(front_door, path)


@pytest.mark.parametrize("path", ENDPOINTS)
@settings(PROPERTY, max_examples=300)
@given(data=st.data())
def test_a_request_with_one_field_spoiled_is_refused_by_name_or_answered(
    front_door: httpx.Client, path: str, data: st.DataObject
) -> None:
    body, spoiled = data.draw(mutated(path))
    response = post(front_door, path, body)
    if response.status_code == 200:
        assert_answered(response, path)
    else:
        error = error_of(response)
        # The parameter at fault is the spoiled one, or one that the spoiled one's value clashes with.
        assert error["param"] is None or root_of(error["param"]) in {*body, spoiled}, (error, spoiled)
    still_answers(front_door, path)


@pytest.mark.parametrize("path", ENDPOINTS)
@settings(PROPERTY, max_examples=300)
@given(data=st.data())
def test_any_number_in_a_numeric_field_is_taken_or_refused_by_name(
    front_door: httpx.Client, path: str, data: st.DataObject
) -> None:
    field = data.draw(st.sampled_from(NUMBER_FIELDS[path]))
    value = data.draw(numbers)
    body = {**GOOD[path], "model": data.draw(st.sampled_from([MODEL, UNMEASURED]))}
    if field == "logit_bias key":
        body["logit_bias"] = {to_json(value).decode("utf-8", "replace"): 1}
    elif field == "logit_bias value":
        body["logit_bias"] = {"5": value}
    else:
        body[field] = value
    response = post(front_door, path, body)
    if response.status_code == 200:
        assert_answered(response, path)
    else:
        error = error_of(response, 400)
        in_value = field != "logit_bias key"
        not_json = in_value and ((isinstance(value, float) and not math.isfinite(value)) or value in NOT_JSON)
        expected: set[str | None] = (
            {None} if not_json else {field.removesuffix(" key").removesuffix(" value")}
        )
        if field == "max_completion_tokens":
            # The context check (router/admission/fits.py) names `max_tokens` for either of the two.
            expected.add("max_tokens")
        assert error["param"] in expected, (error, field, value)
    still_answers(front_door, path)


@pytest.mark.parametrize("path", ENDPOINTS)
@PROPERTY
@given(data=st.data())
def test_random_bytes_and_corrupted_json_are_4xx(
    front_door: httpx.Client, path: str, data: st.DataObject
) -> None:
    good = bytearray(to_json(GOOD[path]))
    if data.draw(st.booleans()):
        content = data.draw(st.binary(max_size=200))
    else:
        for _ in range(data.draw(st.integers(1, 4))):
            at = data.draw(st.integers(0, len(good)))
            good[at : at + data.draw(st.integers(0, 3))] = data.draw(st.binary(max_size=3))
        content = bytes(good)
    response = post(front_door, path, content)
    if response.status_code == 200:  # the corruption left a valid request (a digit changed, say)
        assert_answered(response, path)
    else:
        error_of(response)
    still_answers(front_door, path)


CONTENT_TYPES = [
    "text/plain", "text/json", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
    "application/jsonx", "application/json-patch", "json", "", "*/*", "application/*",
    "application/json; charset=utf-8", "APPLICATION/JSON", "application/json;", "application/vnd.api+json",
]  # fmt: skip
# Anything a header may carry (HTTP allows Latin-1 bytes; no whitespace at either end).
header_text = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=40
).map(lambda text: text.strip(" \t"))


def is_json_media_type(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )


@pytest.mark.parametrize("path", ENDPOINTS)
@settings(PROPERTY, max_examples=60)
@given(content_type=st.sampled_from(CONTENT_TYPES) | header_text)
def test_only_json_content_types_are_read(front_door: httpx.Client, path: str, content_type: str) -> None:
    response = post(front_door, path, GOOD[path], content_type)
    if is_json_media_type(content_type):
        assert_answered(response, path)
    else:
        assert error_of(response, 415)["code"] == "unsupported_media_type"
    still_answers(front_door, path)


token_ids = st.integers(-2, 2**31 + 1) | st.sampled_from([True, False, 1.0, 2**64])
prompts = st.one_of(
    plain_json,
    st.text(max_size=10),
    st.lists(token_ids, max_size=5),
    st.lists(st.lists(token_ids, max_size=3), max_size=4),
    st.lists(st.text(max_size=5) | st.lists(token_ids, max_size=3), max_size=4),
    st.lists(st.just("a"), min_size=127, max_size=130),
)


def _is_token_id(item: Any) -> bool:
    return isinstance(item, int) and not isinstance(item, bool) and 0 <= item < 2**31


def prompt_count(prompt: Any) -> int | None:
    """How many prompts OpenAI's four shapes hold in `prompt`; None for any other shape."""
    if isinstance(prompt, str):
        return 1 if prompt else None
    if not isinstance(prompt, list) or not prompt:
        return None
    if all(_is_token_id(item) for item in prompt):
        return 1
    for item in prompt:
        is_text = isinstance(item, str) and item
        is_ids = isinstance(item, list) and item and all(_is_token_id(token) for token in item)
        if not (is_text or is_ids):
            return None
    return len(prompt) if len(prompt) <= 128 else None


@PROPERTY
@given(prompt=prompts)
def test_a_prompt_is_one_of_four_shapes_or_a_400_naming_it(front_door: httpx.Client, prompt: Any) -> None:
    # The model without published limits: the shape alone decides, not the vocabulary.
    response = post(front_door, COMPLETIONS, {"model": UNMEASURED, "prompt": prompt, "max_tokens": 3})
    count = prompt_count(prompt)
    if count is not None:
        assert_answered(response, COMPLETIONS, choices=count)
    else:
        param = error_of(response, 400)["param"]
        assert param is not None and root_of(param) == "prompt", param
    still_answers(front_door, COMPLETIONS)


def deep(depth: int) -> Raw:
    return Raw(b"[" * depth + b"]" * depth)


@pytest.mark.parametrize("path", ENDPOINTS)
@settings(PROPERTY, max_examples=40)
@given(depth=st.integers(1, 1500), where=st.sampled_from(["body", "unknown", "schema", "tool", "bias"]))
def test_nesting_at_any_depth_is_answered_or_refused(
    front_door: httpx.Client, path: str, depth: int, where: str
) -> None:
    body: Any = dict(GOOD[path])
    if where == "body":
        body = deep(depth)
    elif where == "unknown":
        body["extra"] = deep(depth)
    elif where == "schema" and path == CHAT:
        # Free-form JSON that the front door encodes again, into the job's structured output.
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "n", "schema": {"a": deep(depth)}},
        }
    elif where == "tool" and path == CHAT:
        # Arguments schema of the one tool that must be called: encoded again into the job too.
        function = {"name": "f", "parameters": {"type": "object", "a": deep(depth)}}
        body.update(tools=[{"type": "function", "function": function}], tool_choice="required")
    else:
        body["logit_bias"] = {"5": deep(depth)}
    response = post(front_door, path, body)
    if response.status_code == 200:
        assert_answered(response, path)
    else:
        error_of(response, 400)
    still_answers(front_door, path)


# --- the concrete cases that once misbehaved ------------------------------------------------------


def chat(**fields: Any) -> dict[str, Any]:
    return {**GOOD[CHAT], **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {**GOOD[COMPLETIONS], **fields}


def user_says(content: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
TOO_LONG_TEXT = "a" * (LIMITS.max_model_len * LIMITS.max_token_chars + 1)
# (path, body, content type, status, param, code); a None param or code is not checked.
CASES: dict[str, tuple[str, Any, str | None, int, str | None, str | None]] = {
    "invalid UTF-8 in a string": (CHAT, chat(messages=user_says(Raw(b'"caf\xe9 \xff"'))), "application/json", 400, None, "invalid_json"),
    "a surrogate encoded in UTF-8": (CHAT, chat(messages=user_says(Raw(b'"\xed\xa0\x80"'))), "application/json", 400, None, "invalid_json"),
    "a lone surrogate escape": (CHAT, chat(messages=user_says(Raw(b'"\\ud800"'))), "application/json", 400, None, None),
    "10,000-deep JSON": (CHAT, deep(10_000), "application/json", 400, None, None),
    "10,000-deep JSON in an unknown field": (CHAT, chat(extra=deep(10_000)), "application/json", 400, None, "invalid_json"),
    "10,000-deep JSON in a field": (CHAT, chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"a": deep(10_000)}}}]), "application/json", 400, None, "invalid_json"),
    "10,000-deep completion": (COMPLETIONS, completion(prompt=deep(10_000)), "application/json", 400, None, "invalid_json"),
    "seed beyond 64 bits": (CHAT, chat(seed=2**64), "application/json", 400, "seed", "invalid_value"),
    "seed below 64 bits": (CHAT, chat(seed=-(2**63) - 1), "application/json", 400, "seed", "invalid_value"),
    "seed of a hundred digits": (COMPLETIONS, completion(seed=Raw(b"9" * 100)), "application/json", 400, "seed", "invalid_value"),
    "max_tokens far beyond the context": (CHAT, chat(max_tokens=1_000_000), "application/json", 400, "max_tokens", "context_length_exceeded"),
    "max_tokens beyond 64 bits": (COMPLETIONS, completion(max_tokens=2**70), "application/json", 400, "max_tokens", None),
    "max_tokens beyond 64 bits, limits unknown": (CHAT, chat(model=UNMEASURED, max_tokens=2**70), "application/json", 400, "max_tokens", None),
    "max_completion_tokens beyond 64 bits, limits unknown": (CHAT, chat(model=UNMEASURED, max_completion_tokens=2**64), "application/json", 400, "max_completion_tokens", None),
    "top_k beyond 64 bits, limits unknown": (COMPLETIONS, completion(model=UNMEASURED, top_k=2**64), "application/json", 400, "top_k", None),
    "min_tokens beyond 64 bits, limits unknown": (CHAT, chat(model=UNMEASURED, min_tokens=2**64), "application/json", 400, "min_tokens", None),
    "logit_bias token beyond 64 bits, limits unknown": (CHAT, chat(model=UNMEASURED, logit_bias={"1" * 25: 1}), "application/json", 400, "logit_bias", "invalid_value"),
    "logit_bias token outside the vocabulary": (COMPLETIONS, completion(logit_bias={"5000": 1}), "application/json", 400, "logit_bias", "invalid_value"),
    "prompt longer than the context can hold": (CHAT, chat(messages=user_says(TOO_LONG_TEXT)), "application/json", 400, "messages", "context_length_exceeded"),
    "token ids filling the context": (COMPLETIONS, completion(prompt=[1] * LIMITS.max_model_len), "application/json", 400, "prompt", "context_length_exceeded"),
    "token id outside the vocabulary": (COMPLETIONS, completion(prompt=[[1], [5000]]), "application/json", 400, "prompt", "invalid_value"),
    "temperature 1e999": (CHAT, chat(temperature=Raw(b"1e999")), "application/json", 400, "temperature", None),
    "temperature NaN": (CHAT, chat(temperature=Raw(b"NaN")), "application/json", 400, None, None),
    "JSON sent as text/plain": (CHAT, chat(), "text/plain", 415, None, "unsupported_media_type"),
    "JSON sent as a form": (COMPLETIONS, completion(), "application/x-www-form-urlencoded", 415, None, "unsupported_media_type"),
    "JSON sent with no Content-Type": (COMPLETIONS, completion(), None, 415, None, "unsupported_media_type"),
    "stream_options without stream": (CHAT, chat(stream_options={"include_usage": True}), "application/json", 400, "stream_options", "invalid_value"),
    "stream_options with stream false": (COMPLETIONS, completion(stream=False, stream_options={}), "application/json", 400, "stream_options", "invalid_value"),
    "image part whose bytes are no image": (CHAT, chat(messages=user_says([{"type": "text", "text": "What is it?"}, IMAGE])), "application/json", 400, "messages[0].content[1].image_url", "invalid_image"),
    "audio content part": (CHAT, chat(messages=user_says([AUDIO])), "application/json", 400, "messages[0].content[0].type", "unsupported_content"),
    "n times prompts beyond 128 choices": (COMPLETIONS, completion(prompt=["a"] * 3, n=50), "application/json", 400, "n", "invalid_value"),
    "max_tokens far beyond the context, streamed": (CHAT, chat(stream=True, max_tokens=1_000_000), "application/json", 400, "max_tokens", "context_length_exceeded"),
    "top_k beyond 64 bits, streamed, limits unknown": (COMPLETIONS, completion(model=UNMEASURED, stream=True, top_k=2**64), "application/json", 400, "top_k", None),
    "image part whose bytes are no image, streamed": (CHAT, chat(stream=True, messages=user_says([IMAGE])), "application/json", 400, "messages[0].content[0].image_url", "invalid_image"),
    "body over the size limit": (CHAT, chat(messages=user_says("a" * BODY_LIMIT)), "application/json", 413, None, None),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_concrete_hostile_bodies(front_door: httpx.Client, case: str) -> None:
    path, body, content_type, status, param, code = CASES[case]
    error = error_of(post(front_door, path, body, content_type), status)
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    still_answers(front_door, path)


def test_a_body_over_the_size_limit_without_a_length_is_a_413(front_door: httpx.Client) -> None:
    def chunked() -> Iterator[bytes]:
        yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
        for _ in range(BODY_LIMIT // 65_536 + 2):
            yield b"a" * 65_536
        yield b'"}]}'

    response = front_door.post(CHAT, content=chunked(), headers={"content-type": "application/json"})
    error_of(response, 413)
    still_answers(front_door, CHAT)


@pytest.mark.parametrize(
    ("prompt", "choices"),
    [("Hi", 1), (["Hi", "there"], 2), ([1, 2, 3], 1), ([[1, 2], [3]], 2)],
    ids=["string", "strings", "token ids", "lists of token ids"],
)
def test_each_prompt_shape_is_answered(front_door: httpx.Client, prompt: Any, choices: int) -> None:
    assert_answered(post(front_door, COMPLETIONS, completion(prompt=prompt)), COMPLETIONS, choices=choices)


@pytest.mark.parametrize(
    "prompt",
    [5, 1.5, True, None, {"text": "Hi"}, "", [], [[]], [1.5], [True], [-1], [2**31], [2**64], ["Hi", 1],
     [["Hi"]], [[1, "a"]], [[1], []], ["Hi", ""], [None], ["a"] * 129],
)  # fmt: skip
def test_any_other_prompt_is_a_400_naming_it(front_door: httpx.Client, prompt: Any) -> None:
    param = error_of(post(front_door, COMPLETIONS, completion(prompt=prompt)), 400)["param"]
    assert param is not None and root_of(param) == "prompt", param
    still_answers(front_door, COMPLETIONS)
