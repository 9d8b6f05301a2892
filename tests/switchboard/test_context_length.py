"""The context-length refusal, as the front door and a worker's prompt builder both give it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from switchboard.context_length import (
    CONTEXT_LENGTH_EXCEEDED,
    completion_refusal,
    least_chat_chars,
    prompt_refusal,
    text_refusal,
)
from switchboard.wire import ChatMessage, ModelLimits, SamplingParams, ToolCall
from workers.engines.base import EngineRequest
from workers.engines.prompts import PromptBuilder

LIMITS = ModelLimits(max_model_len=64, vocab_size=1000, max_token_chars=4)


def test_text_longer_than_any_text_of_the_context_is_refused() -> None:
    assert text_refusal(LIMITS, 256, "messages") is None
    refusal = text_refusal(LIMITS, 257, "messages")
    assert refusal is not None
    assert (refusal.param, refusal.code) == ("messages", CONTEXT_LENGTH_EXCEEDED)
    assert refusal.message == (
        "This model's maximum context length is 64 tokens, and the text of `messages` is 257 characters "
        "long, more than any text of that many tokens can be (256 characters). Shorten `messages`."
    )


def test_a_prompt_filling_the_context_is_refused() -> None:
    assert prompt_refusal(LIMITS, 63, "prompt") is None
    refusal = prompt_refusal(LIMITS, 64, "prompt")
    assert refusal is not None
    assert (refusal.param, refusal.code) == ("prompt", CONTEXT_LENGTH_EXCEEDED)
    assert refusal.message == (
        "This model's maximum context length is 64 tokens, and `prompt` alone takes 64 tokens, which "
        "leaves no room for a completion. Shorten `prompt`."
    )


def test_max_tokens_before_the_prompt_is_tokenized_counts_the_prompt_as_one_token() -> None:
    assert completion_refusal(LIMITS, None, "prompt", prompt_tokens=None) is None
    assert completion_refusal(LIMITS, 63, "prompt", prompt_tokens=None) is None
    refusal = completion_refusal(LIMITS, 64, "prompt", prompt_tokens=None)
    assert refusal is not None
    assert (refusal.param, refusal.code) == ("max_tokens", CONTEXT_LENGTH_EXCEEDED)
    assert refusal.message == (
        "This model's maximum context length is 64 tokens, so max_tokens must be below 64 (the prompt "
        "takes at least one token); it is 64."
    )


def test_max_tokens_after_a_tokenized_prompt_must_fit_beside_it() -> None:
    assert completion_refusal(LIMITS, 54, "messages", prompt_tokens=10) is None
    refusal = completion_refusal(LIMITS, 55, "messages", prompt_tokens=10)
    assert refusal is not None
    assert (refusal.param, refusal.code) == ("max_tokens", CONTEXT_LENGTH_EXCEEDED)
    assert refusal.message == (
        "This model's maximum context length is 64 tokens. However, you requested 65 tokens (10 in the "
        "messages, 55 in the completion). Reduce the length of the messages or of the completion "
        "(max_tokens)."
    )


# --- what a chat template certainly renders ------------------------------------------------------
#
# The count must never exceed the prompt (a count too high refuses what fits). It is checked against
# prompts the worker's own prompt builder renders, through chat templates of the styles models use:
# tools and calls as JSON, as XML-like tags, as Python-like calls; and a template that renders no tools.

JSON_STYLE = (
    "{% if tools %}<tools>{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>{% endif %}"
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content or '' }}"
    '{% for call in m.tool_calls or [] %}<call>{"name": {{ call.function.name | tojson }}, "arguments": '
    "{% if call.function.arguments is string %}{{ call.function.arguments }}"
    "{% else %}{{ call.function.arguments | tojson }}{% endif %}}</call>{% endfor %}\n{% endfor %}"
)
XML_STYLE = (
    "{% for tool in tools or [] %}{% set f = tool.function %}<function><name>{{ f.name }}</name>"
    "<description>{{ f.description }}</description>"
    "{% for name, p in f.parameters.properties | items %}<parameter><name>{{ name }}</name>"
    "{% for k, v in p | items %}<{{ k }}>{{ v if v is string else v | tojson }}</{{ k }}>{% endfor %}"
    "</parameter>{% endfor %}</function>{% endfor %}"
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content or '' }}"
    "{% for call in m.tool_calls or [] %}<function={{ call.function.name }}>"
    "{% for k, v in call.function.arguments | items %}<parameter={{ k }}>"
    "{{ v if v is string else v | tojson }}</parameter>{% endfor %}</function>{% endfor %}{% endfor %}"
)
PYTHONIC_STYLE = (
    "{% for tool in tools or [] %}{{ tool | tojson(indent=4) }}{% endfor %}"
    "{% for m in messages %}{{ m.content or '' }}{% for call in m.tool_calls or [] %}"
    "[{{ call.function.name }}({% for k, v in call.function.arguments | items %}{{ k }}={{ v | tojson }}, "
    "{% endfor %})]{% endfor %}{% endfor %}"
)
NO_TOOLS = "{% for m in messages %}{{ m.content or '' }}{% endfor %}"

TOOLS = json.dumps(
    [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": 'The weather in a city, "now".\n' * 10,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "description": "Its name, in full."},
                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                        "days": {"type": "integer", "minimum": 1},
                        "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
                    },
                    "required": ["city"],
                },
            },
        }
    ]
)
ARGUMENTS = [
    '{\n    "city":        "Paris",\n\n    "unit": "celsius"\n}',  # indented: the template drops it
    json.dumps({"city": '\n\t"' * 50, "days": 3}),  # escapes: the template may write them raw
    json.dumps({"city": "Zürich" * 20, "where": {"lat": 47.4, "tags": ["a", "b"]}}, ensure_ascii=True),
    '{"city": "Paris", "city": "' + "x" * 200 + '"}',  # a key twice: the template gets the last
]


def conversation(arguments: str) -> tuple[ChatMessage, ...]:
    return (
        ChatMessage(role="system", content="You answer with tools."),
        ChatMessage(role="user", content="And the weather?", name="ada"),
        ChatMessage(
            role="assistant", tool_calls=(ToolCall(id="call_1", name="weather", arguments=arguments),)
        ),
        ChatMessage(role="tool", content="Sunny, 21 degrees.", tool_call_id="call_1"),
    )


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """A tokenizer whose every word is one token: only its chat template matters here."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    inner = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    inner.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="<unk>")


def rendered(tokenizer: Any, template: str, messages: tuple[ChatMessage, ...], tools: str | None) -> str:
    """The prompt text the worker builds for `messages` and `tools` with `template`."""
    tokenizer.chat_template = template
    builder = PromptBuilder(tokenizer, model_name="m", max_model_len=1_000_000, vocab_size=1)
    request = EngineRequest(request_id="r", sampling=SamplingParams(), messages=messages, tools=tools)
    return builder.build(request).text


@pytest.mark.parametrize("template", [JSON_STYLE, XML_STYLE, PYTHONIC_STYLE], ids=["json", "xml", "pythonic"])
@pytest.mark.parametrize("arguments", ARGUMENTS, ids=["indented", "escapes", "unicode", "key twice"])
def test_a_template_that_renders_tools_writes_at_least_what_is_counted(
    tokenizer: Any, template: str, arguments: str
) -> None:
    messages = conversation(arguments)
    counted = least_chat_chars(messages, TOOLS, template_renders_tools=True)
    prompt = rendered(tokenizer, template, messages, TOOLS)
    assert counted <= len(prompt), prompt
    # The tools and the call are counted, not only the messages' text.
    assert counted > sum(len(m.content or "") for m in messages) + len(
        json.loads(TOOLS)[0]["function"]["description"]
    )


@pytest.mark.parametrize("template", [NO_TOOLS, JSON_STYLE], ids=["no tools", "json"])
def test_without_a_template_known_to_render_tools_only_the_messages_text_counts(
    tokenizer: Any, template: str
) -> None:
    messages = conversation(ARGUMENTS[0])
    counted = least_chat_chars(messages, TOOLS, template_renders_tools=False)
    assert counted == sum(len(m.content or "") for m in messages)
    assert counted <= len(rendered(tokenizer, template, messages, TOOLS))


def test_arguments_count_as_the_text_they_decode_to() -> None:
    def counted(arguments: str) -> int:
        message = ChatMessage(role="assistant", tool_calls=(ToolCall(id="c", name="f", arguments=arguments),))
        return least_chat_chars([message], None, template_renders_tools=True)

    assert counted('{\n  "city":   "Paris"\n}') == len("f") + len("city") + len("Paris")
    assert counted('{"a": "\\n\\u00e9", "n": 12345, "ok": true}') == len("f") + len("a") + 2 + len("n") + len(
        "ok"
    )
    assert counted("not JSON at all") == len("f") + len("not JSON at all")  # the template gets the text
    # Nested past Python's recursion: no template gets it parsed, and counting it raises nothing.
    assert counted("[" * 100_000) == len("f")


def test_tools_count_their_names_descriptions_and_properties() -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "description": "Does.",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
        },
    }
    total = least_chat_chars([], json.dumps([tool]), template_renders_tools=True)
    assert total == len("f") + len("Does.") + len("x") + len("type") + len("string")
