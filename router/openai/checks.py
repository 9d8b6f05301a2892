"""Checks that no single field's type can express: parameters that need others, content parts, tool
choices, prompts' shapes, and OpenAI parameters that are refused by name rather than ignored.

Each failure is a 400 naming the parameter at fault (`param`), as OpenAI's own errors do.
"""

from __future__ import annotations

from typing import Any

from router.openai.chat import ChatCompletionRequest, NamedToolChoice, TextFormat
from router.openai.common import INT32_MAX, UNSET, SamplingRequest
from router.openai.completions import CompletionRequest
from router.openai.errors import InvalidRequestError

# Completions: prompts per request, and choices per request (prompts times n).
MAX_PROMPTS = 128
MAX_CHOICES = 128
TEXT_ONLY = "the models served here write text only"
TEXT_AND_IMAGES = "the models served here take text and images"


def unsupported(param: str, why: str) -> InvalidRequestError:
    """The 400 for a parameter that OpenAI defines and that Switchboard cannot honour."""
    return InvalidRequestError(
        f"`{param}` is not supported: {why}.", param=param, code="unsupported_parameter"
    )


def invalid(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code="invalid_value")


def check_chat(request: ChatCompletionRequest) -> None:
    """Refuse what the chat request's fields allow one by one but not together."""
    _check_common(request)
    _check_unsupported_chat_fields(request)
    for position, message in enumerate(request.messages):
        _check_message(position, message)
    if request.top_logprobs is not None and not request.logprobs:
        raise invalid("top_logprobs", "`top_logprobs` needs `logprobs` set to true.")
    _check_tools(request)
    response_format = request.response_format
    if request.structured_outputs is not None and not isinstance(response_format, TextFormat | None):
        raise invalid("structured_outputs", "Give `response_format` or `structured_outputs`, not both.")


def check_completion(request: CompletionRequest) -> int:
    """Refuse what the completion request's fields allow one by one but not together; the prompt count."""
    _check_common(request)
    if request.suffix:
        raise unsupported("suffix", "the models served here are not run in fill-in-the-middle mode")
    if request.best_of is not None and request.best_of != request.n:
        raise unsupported(
            "best_of", "the engines generate exactly `n` choices; leave `best_of` out, or equal to `n`"
        )
    prompts = prompt_count(request.prompt)
    if prompts * request.n > MAX_CHOICES:
        raise invalid("n", f"{prompts} prompts times n={request.n} is more than {MAX_CHOICES} choices.")
    return prompts


def prompt_count(prompt: str | list[Any]) -> int:
    """How many prompts `prompt` holds, refusing shapes other than OpenAI's four."""
    if isinstance(prompt, str):
        _check_prompt_text(prompt, "prompt")
        return 1
    if not prompt:
        raise invalid("prompt", "`prompt` is an empty list; give at least one prompt.")
    if all(isinstance(item, int) and not isinstance(item, bool) for item in prompt):
        _check_token_ids(prompt, "prompt")
        return 1
    if len(prompt) > MAX_PROMPTS:
        raise invalid("prompt", f"At most {MAX_PROMPTS} prompts per request; this one has {len(prompt)}.")
    for position, item in enumerate(prompt):
        param = f"prompt[{position}]"
        if isinstance(item, str):
            _check_prompt_text(item, param)
        elif isinstance(item, list) and item and all(_is_token_id(token) for token in item):
            continue
        else:
            raise invalid(
                param,
                "`prompt` must be a string, a list of strings, a list of token ids (non-negative "
                "integers) or a list of non-empty lists of token ids.",
            )
    return len(prompt)


def logit_bias_tokens(logit_bias: dict[str, float] | None) -> dict[int, float] | None:
    """`logit_bias` with its keys as token ids; a key that is not one is a 400."""
    if not logit_bias:
        return None
    biases: dict[int, float] = {}
    for key, bias in logit_bias.items():
        try:
            token = int(key)
        except ValueError:
            token = -1
        if not 0 <= token <= INT32_MAX or str(token) != key.strip():
            raise invalid(
                "logit_bias",
                f"`logit_bias` keys are token ids (integers from 0 to {INT32_MAX}); got {key!r}.",
            )
        biases[token] = bias
    return biases


def _check_common(request: SamplingRequest) -> None:
    if request.stream_options is not None and not request.stream:
        raise invalid("stream_options", "`stream_options` is only allowed when `stream` is true.")
    logit_bias_tokens(request.logit_bias)
    constraints = request.structured_outputs
    if constraints is not None:
        # An empty schema (`{}`: any JSON) is a constraint too; `json_object: false` is none.
        kinds = [
            name
            for name in ("json", "json_object", "regex", "choice", "grammar")
            if (constraints.json_object if name == "json_object" else getattr(constraints, name) is not None)
        ]
        if len(kinds) != 1:
            raise invalid(
                "structured_outputs",
                "`structured_outputs` takes exactly one of `json`, `json_object`, `regex`, `choice` "
                f"and `grammar`; got {', '.join(kinds) or 'none'}.",
            )


def _check_token_ids(ids: list[Any], param: str) -> None:
    """Refuse, naming it, the first item of a token-id prompt that is no token id."""
    for position, token in enumerate(ids):
        if not _is_token_id(token):
            raise invalid(
                f"{param}[{position}]",
                f"Token ids are integers from 0 to {INT32_MAX}; `{param}[{position}]` is {token}.",
            )


def _check_prompt_text(text: str, param: str) -> None:
    if not text:
        raise invalid(param, "The prompt is empty; give at least one character.")


def _is_token_id(item: Any) -> bool:
    return isinstance(item, int) and not isinstance(item, bool) and 0 <= item <= INT32_MAX


# A field OpenAI defines, the values that change nothing here, and why others are refused.
_UNSUPPORTED_CHAT_FIELDS: dict[str, tuple[tuple[Any, ...], str]] = {
    "audio": ((None,), f"audio output is not available: {TEXT_ONLY}"),
    "modalities": ((None, ["text"]), f'{TEXT_ONLY}; leave `modalities` out or set it to ["text"]'),
    "prediction": ((None,), "predicted outputs are not available"),
    "web_search_options": ((None,), "web search is not available"),
    "functions": ((None,), "it is deprecated by OpenAI; give `tools` instead"),
    "function_call": ((None,), "it is deprecated by OpenAI; give `tool_choice` instead"),
    "store": ((None, False), "completions are not stored here"),
    "reasoning_effort": ((None,), "the models served here take no reasoning effort"),
    "verbosity": ((None,), "the models served here take no verbosity setting"),
}


def _check_unsupported_chat_fields(request: ChatCompletionRequest) -> None:
    for field, (harmless, why) in _UNSUPPORTED_CHAT_FIELDS.items():
        value = getattr(request, field)
        if value is not UNSET and value not in harmless:
            raise unsupported(field, why)


def _check_message(position: int, message: Any) -> None:
    param = f"messages[{position}]"
    if isinstance(message.content, list):
        for index, part in enumerate(message.content):
            _check_part(f"{param}.content[{index}]", part)
    if message.role == "tool" and not message.tool_call_id:
        raise invalid(
            f"{param}.tool_call_id", "A message of role `tool` needs the `tool_call_id` it answers."
        )
    if message.tool_calls and message.role != "assistant":
        raise invalid(f"{param}.tool_calls", "Only assistant messages carry `tool_calls`.")
    if message.content is None and not (message.role == "assistant" and message.tool_calls):
        raise invalid(f"{param}.content", f"A message of role `{message.role}` needs `content`.")


def _check_part(param: str, part: Any) -> None:
    if part.type == "text":
        if part.text is None:
            raise invalid(f"{param}.text", "A text part needs `text`.")
        return
    if part.type == "refusal" and part.refusal is not None:
        return
    if part.type == "image_url":
        if part.image is None:
            raise invalid(f"{param}.image_url", "An image_url part needs `image_url` with its `url`.")
        return
    if part.type in ("input_image", "image", "input_audio", "audio", "file", "video_url"):
        raise InvalidRequestError(
            f"Content parts of type `{part.type}` are not supported: {TEXT_AND_IMAGES}. Send `text` "
            "and `image_url` parts.",
            param=f"{param}.type",
            code="unsupported_content",
        )
    raise invalid(f"{param}.type", f"Unknown content part type `{part.type}`; use `text` or `image_url`.")


def _check_tools(request: ChatCompletionRequest) -> None:
    choice = request.tool_choice
    names = [tool.function.name for tool in request.tools or ()]
    if len(set(names)) != len(names):
        raise invalid("tools", "Two tools share a function name; names must be unique.")
    if choice is None or choice == "none":
        return
    if not names:
        raise invalid("tool_choice", "`tool_choice` needs `tools`.")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise invalid(
            "tool_choice",
            f"`tool_choice` names the function `{choice.function.name}`, which is not among `tools` "
            f"({', '.join(names)}).",
        )
    if choice == "auto":
        return
    constrained = request.structured_outputs is not None or (
        request.response_format is not None and not isinstance(request.response_format, TextFormat)
    )
    if constrained:
        param = "response_format" if request.structured_outputs is None else "structured_outputs"
        raise invalid(
            param, f"`{param}` cannot be combined with a `tool_choice` that makes the model call a tool."
        )
