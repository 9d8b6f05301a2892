"""The relays a generation's answer may take: a chat completion, a completion, or a response."""

from __future__ import annotations

from router.relay.chat import ChatRelay
from router.relay.completions import CompletionRelay
from router.relay.responses import ResponsesRelay

AnswerRelay = ChatRelay | CompletionRelay | ResponsesRelay
