"""OpenAI chat request decoding, validation errors and response encoding (pure, no server)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from router.openai.chat import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatMessageIn,
    ChatMessageOut,
    ContentPart,
)
from router.openai.common import CompletionUsage, stop_list
from router.openai.errors import (
    EngineError,
    InvalidRequestError,
    JobTimeoutError,
    MethodNotAllowedError,
    ModelLoadFailedError,
    ModelLoadingError,
    ModelNotFoundError,
    OpenAIError,
    RouteNotFoundError,
    ServiceUnavailableError,
    from_validation_error,
)

decoder = msgspec.json.Decoder(ChatCompletionRequest)
USER_HI = {"role": "user", "content": "hi"}


def body(**fields: Any) -> bytes:
    """A JSON request body: a valid minimal request updated with `fields` (None removes a key)."""
    data: dict[str, Any] = {"model": "m", "messages": [USER_HI]}
    for key, value in fields.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return msgspec.json.encode(data)


def rejection(raw: bytes) -> InvalidRequestError:
    """Decode `raw`, expect a failure, and map it to the client-facing error."""
    with pytest.raises((msgspec.ValidationError, msgspec.DecodeError)) as info:
        decoder.decode(raw)
    error = from_validation_error(info.value)
    assert isinstance(error, InvalidRequestError)
    assert error.status_code == 400
    assert error.error_type == "invalid_request_error"
    return error


# --- valid requests -------------------------------------------------------------------------------


def test_minimal_request_gets_defaults() -> None:
    req = decoder.decode(body())
    assert req.model == "m"
    assert len(req.messages) == 1
    assert req.messages[0].role == "user"
    assert req.messages[0].content == "hi"
    assert req.stream is False
    assert req.n == 1
    assert req.max_tokens is None
    assert req.max_completion_tokens is None
    assert req.temperature is None
    assert req.top_p is None
    assert req.stop is None
    assert req.stream_options is None


def test_full_request_decodes_every_field() -> None:
    req = decoder.decode(
        body(
            max_tokens=5,
            max_completion_tokens=7,
            temperature=0.5,
            top_p=0.9,
            seed=42,
            stop=["x"],
            stream=True,
            stream_options={"include_usage": True},
            n=1,
            user="u1",
        )
    )
    assert req.max_tokens == 5
    assert req.max_completion_tokens == 7
    assert req.temperature == 0.5
    assert req.top_p == 0.9
    assert req.seed == 42
    assert req.stop == ["x"]
    assert req.stream is True
    assert req.stream_options is not None and req.stream_options.include_usage is True
    assert req.user == "u1"


def test_string_content_text() -> None:
    req = decoder.decode(body(messages=[{"role": "system", "content": "be brief"}, USER_HI]))
    assert [m.role for m in req.messages] == ["system", "user"]
    assert req.messages[0].text() == "be brief"


def test_list_of_text_parts_is_flattened() -> None:
    parts = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]
    req = decoder.decode(body(messages=[{"role": "user", "content": parts}]))
    content = req.messages[0].content
    assert isinstance(content, list)
    assert all(isinstance(p, ContentPart) for p in content)
    assert req.messages[0].text() == "Hello, world"


def test_null_and_missing_content_flatten_to_empty() -> None:
    req = decoder.decode(
        body(
            messages=[
                {"role": "assistant", "content": None},
                {"role": "user"},
                {"role": "user", "content": []},
            ]
        )
    )
    assert req.messages[0].content is None
    assert [m.text() for m in req.messages] == ["", "", ""]


def test_message_text_direct() -> None:
    assert ChatMessageIn(role="user", content="abc").text() == "abc"
    assert ChatMessageIn(role="user", content=[ContentPart(type="text", text="a")]).text() == "a"
    assert ChatMessageIn(role="tool").text() == ""


def test_unknown_fields_are_ignored() -> None:
    req = decoder.decode(
        body(
            best_guess=0.3,
            chat_template_kwargs={"1": 2},
            messages=[{"role": "user", "content": "hi", "extra": {"a": 1}}],
        )
    )
    assert req.messages[0].text() == "hi"
    assert not hasattr(req, "best_guess")


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 0},
        {"temperature": 2},
        {"temperature": 1},  # an int is a valid float
        {"top_p": 0},
        {"top_p": 1},
        {"max_tokens": 1},
        {"max_completion_tokens": 1},
        {"stop": ["a", "b", "c", "d"]},
        {"stop": ""},
        {"n": 1},
        {"n": 128},
        {"seed": 2**63 - 1},
        {"seed": -(2**63)},
        {"presence_penalty": -2},
        {"frequency_penalty": 2},
        {"top_logprobs": 20},
        {"logit_bias": {"5": 100, "7": -100}},
    ],
)
def test_boundary_values_are_accepted(fields: dict[str, Any]) -> None:
    req = decoder.decode(body(**fields))
    for key, value in fields.items():
        assert getattr(req, key) == value


# --- rejections -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"temperature": 2.01}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.5}, "top_p"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": 5}, "stop"),
        ({"n": 129}, "n"),
        ({"n": 0}, "n"),
        ({"seed": 2**63}, "seed"),
        ({"seed": 2**70}, "seed"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -2.1}, "frequency_penalty"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"model": ""}, "model"),
        ({"model": 5}, "model"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"stream": "yes"}, "stream"),
        ({"seed": "abc"}, "seed"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"stream_options": {"include_usage": "x"}}, "stream_options.include_usage"),
        ({"messages": [{"role": "bot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [USER_HI, {"role": "user", "content": 5}]}, "messages[1].content"),
    ],
)
def test_invalid_values_name_the_param(fields: dict[str, Any], param: str) -> None:
    error = rejection(body(**fields))
    assert error.param == param
    assert error.code == "invalid_value"
    assert param in error.message


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (body(model=None), "model"),
        (body(messages=None), "messages"),
        (body(messages=[{"content": "hi"}]), "messages[0].role"),
        (body(messages=[USER_HI, {"content": "hi"}]), "messages[1].role"),
    ],
)
def test_missing_fields_name_the_param(raw: bytes, param: str) -> None:
    error = rejection(raw)
    assert error.param == param
    assert error.code == "missing_required_parameter"
    assert f"`{param}`" in error.message


@pytest.mark.parametrize("raw", [b"{nope", b"", b'{"model": "m",', b"\xff\xfe"])
def test_malformed_json_has_no_param(raw: bytes) -> None:
    error = rejection(raw)
    assert error.param is None
    assert "JSON" in error.message


def test_body_of_wrong_json_type_has_no_param() -> None:
    error = rejection(b"[]")
    assert error.param is None
    assert error.message


# --- stop_list ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        (None, ()),
        ("", ()),
        ("END", ("END",)),
        ([], ()),
        (["a", "", "b"], ("a", "b")),
        (["\n", "###"], ("\n", "###")),
    ],
)
def test_stop_list(stop: Any, expected: tuple[str, ...]) -> None:
    assert stop_list(stop) == expected


def test_stop_list_from_decoded_request() -> None:
    assert stop_list(decoder.decode(body(stop="x")).stop) == ("x",)
    assert stop_list(decoder.decode(body(stop=["x", "y"])).stop) == ("x", "y")
    assert stop_list(decoder.decode(body()).stop) == ()


# --- errors ---------------------------------------------------------------------------------------


def test_model_not_found_error() -> None:
    error = ModelNotFoundError("gpt-9", ["alpha", "beta"])
    assert error.status_code == 404
    assert error.param == "model"
    assert error.code == "model_not_found"
    assert error.error_type == "invalid_request_error"
    assert "gpt-9" in error.message
    assert "alpha, beta" in error.message
    assert isinstance(error, OpenAIError)


def test_model_not_found_names_no_model_the_caller_may_not_use() -> None:
    error = ModelNotFoundError("x", [])
    assert error.message == "The model `x` does not exist."


def test_error_body_encodes_to_openai_shape() -> None:
    error = InvalidRequestError("bad", param="temperature", code="invalid_value")
    decoded = msgspec.json.decode(msgspec.json.encode(error.body()))
    assert list(decoded) == ["error"]
    assert set(decoded["error"]) == {"message", "type", "param", "code"}
    assert decoded["error"] == {
        "message": "bad",
        "type": "invalid_request_error",
        "param": "temperature",
        "code": "invalid_value",
    }


def test_error_body_keeps_null_param_and_code() -> None:
    decoded = msgspec.json.decode(msgspec.json.encode(InvalidRequestError("oops").body()))
    assert decoded == {
        "error": {"message": "oops", "type": "invalid_request_error", "param": None, "code": None}
    }


@pytest.mark.parametrize(
    ("cls", "status", "type_", "code"),
    [
        (InvalidRequestError, 400, "invalid_request_error", None),
        (RouteNotFoundError, 404, "invalid_request_error", "not_found"),
        (MethodNotAllowedError, 405, "invalid_request_error", "method_not_allowed"),
        (ServiceUnavailableError, 503, "service_unavailable", "service_unavailable"),
        (JobTimeoutError, 504, "timeout", "timeout"),
        (EngineError, 500, "internal_error", "engine_error"),
    ],
)
def test_error_classes(cls: type[OpenAIError], status: int, type_: str, code: str | None) -> None:
    error = cls("msg")
    assert error.status_code == status
    detail = error.body().error
    assert (detail.message, detail.type, detail.code) == ("msg", type_, code)
    assert str(error) == "msg"
    # An explicit code wins over the class default.
    assert cls("msg", code="custom").code == "custom"


# --- responses ------------------------------------------------------------------------------------


def test_chat_completion_encoding() -> None:
    completion = ChatCompletion(
        id="chatcmpl-1",
        created=123,
        model="m",
        choices=[ChatChoice(index=0, message=ChatMessageOut(content="hello"), finish_reason="stop")],
        usage=CompletionUsage(prompt_tokens=3, completion_tokens=2, total_tokens=5),
    )
    data = msgspec.json.decode(msgspec.json.encode(completion))
    assert data == {
        "id": "chatcmpl-1",
        "created": 123,
        "model": "m",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hello", "refusal": None},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        "service_tier": "default",
    }


def _chunk(delta: ChatDelta, **kwargs: Any) -> dict[str, Any]:
    chunk = ChatCompletionChunk(
        id="chatcmpl-1", created=1, model="m", choices=[ChatChunkChoice(index=0, delta=delta)], **kwargs
    )
    result: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(chunk))
    return result


def test_chunk_encoding_fields() -> None:
    data = _chunk(ChatDelta(role="assistant", content="hi"))
    assert data["object"] == "chat.completion.chunk"
    assert data["id"] == "chatcmpl-1"
    assert data["created"] == 1
    assert data["model"] == "m"
    assert data["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": None, "logprobs": None}
    ]
    assert "usage" not in data


def test_chunk_delta_omits_unset_fields() -> None:
    assert _chunk(ChatDelta(content="x"))["choices"][0]["delta"] == {"content": "x"}
    assert _chunk(ChatDelta())["choices"][0]["delta"] == {}
    assert _chunk(ChatDelta(role="assistant", content=""))["choices"][0]["delta"] == {
        "role": "assistant",
        "content": "",
    }


def test_chunk_usage_null_when_set_to_none() -> None:
    data = _chunk(ChatDelta(content="x"), usage=None)
    assert "usage" in data
    assert data["usage"] is None


def test_chunk_usage_values() -> None:
    data = _chunk(ChatDelta(), usage=CompletionUsage(prompt_tokens=1, completion_tokens=2, total_tokens=3))
    assert data["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}


@pytest.mark.parametrize(("retry_after_s", "header"), [(11.2, "12"), (0.2, "1"), (-3.0, "1"), (30.0, "30")])
def test_load_failure_carries_retry_after(retry_after_s: float, header: str) -> None:
    error = ModelLoadFailedError("tiny", "CUDA out of memory.\n", retry_after_s)
    assert (error.status_code, error.error_type, error.code) == (
        503,
        "service_unavailable",
        "model_load_failed",
    )
    assert error.headers == {"Retry-After": header}
    assert error.message == f"Model `tiny` failed to load: CUDA out of memory. Retrying in {header} s."


def test_model_loading_says_how_long_a_load_takes() -> None:
    loading = ModelLoadingError("tiny", loading=True, typical_load_s=49.6, retry_after_s=37.2)
    assert (loading.status_code, loading.code) == (503, "model_loading")
    assert loading.headers == {"Retry-After": "38"}
    assert loading.message == (
        "Model `tiny` is still loading (a load usually takes about 50 s); "
        "the request was dropped when its deadline passed. Retry in 38 s."
    )
    cold = ModelLoadingError("tiny", loading=False, typical_load_s=None, retry_after_s=30)
    assert "is not loaded yet" in cold.message
    assert "how long a load takes is not known yet" in cold.message


def test_errors_carry_no_headers_unless_given() -> None:
    assert InvalidRequestError("bad").headers == {}
    assert ServiceUnavailableError("busy", headers={"Retry-After": "3"}).headers == {"Retry-After": "3"}
