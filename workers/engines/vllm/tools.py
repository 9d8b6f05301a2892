"""Tool calls in a model's own syntax, parsed by vLLM's parser for that syntax (`tool_choice: "auto"`).

A model decides by itself whether to call a tool, and writes the call its own way (`<tool_call>`
tags, a JSON line, a Python-like list, ...); the model's configured `tool_call_parser` turns that
text into calls. A call can only be parsed once it is complete, so each choice's text is held until
the choice ends, then sent as the text around the calls plus the calls themselves.
"""

from __future__ import annotations

import json
from typing import Any

from switchboard.wire import ToolCall
from workers.engines.base import Delta, EngineRequest


def tool_parser_class(name: str) -> Any:
    """vLLM's parser class called `name`; a clear error if there is none (checked at engine start)."""
    from vllm.tool_parsers import ToolParserManager

    try:
        return ToolParserManager.get_tool_parser(name)
    except KeyError:
        known = ", ".join(sorted({*ToolParserManager.tool_parsers, *ToolParserManager.lazy_parsers}))
        raise ValueError(f"unknown tool_call_parser {name!r}; vLLM knows: {known}") from None


class ToolCallExtractor:
    """Holds each choice's deltas until the choice ends, then parses the tool calls out of its text."""

    def __init__(self, parser_name: str, tokenizer: Any, request: EngineRequest) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        tools = json.loads(request.tools) if request.tools else []
        # The parsers read the request only for its tools and tool choice.
        chat_request = ChatCompletionRequest.model_validate(
            {
                "model": "parser",
                "messages": [{"role": "user", "content": ""}],
                "tools": tools,
                "tool_choice": "auto",
            }
        )
        self._parser = tool_parser_class(parser_name)(tokenizer, chat_request.tools)
        self._request = self._parser.adjust_request(chat_request)
        self._held: dict[int, list[Delta]] = {}

    @property
    def skip_special_tokens(self) -> bool:
        """Whether the text may leave special tokens out (some syntaxes mark calls with them)."""
        return bool(self._request.skip_special_tokens)

    def hold(self, delta: Delta) -> Delta | None:
        """Nothing while the choice runs; when it ends, its text and calls as one delta."""
        held = self._held.setdefault(delta.index, [])
        held.append(delta)
        if delta.finish_reason is None and not delta.last:
            return None
        del self._held[delta.index]
        text = "".join(d.text for d in held)
        content, calls = self._parse(text) if delta.finish_reason is not None else (text, ())
        return Delta(
            text=content,
            index=delta.index,
            logprobs=tuple(entry for d in held for entry in d.logprobs),
            tool_calls=calls,
            prompt_tokens=delta.prompt_tokens,
            completion_tokens=delta.completion_tokens,
            finish_reason=delta.finish_reason,
            last=delta.last,
        )

    def _parse(self, text: str) -> tuple[str, tuple[ToolCall, ...]]:
        info = self._parser.extract_tool_calls(text, self._request)
        if not info.tools_called:
            return text, ()
        calls = tuple(
            ToolCall(id=call.id, name=call.function.name, arguments=call.function.arguments)
            for call in info.tool_calls
        )
        return info.content or "", calls
