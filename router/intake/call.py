"""One API request as the steps of its pipeline see it: what it asked, who asked, and what its
earlier steps left for the later ones (the ids of its jobs, the tokens they spent)."""

from __future__ import annotations

from typing import Any

from litestar import Request

from router.admission.auth import Caller
from router.intake.resume import ResumePoint
from router.openai.chat import ChatCompletionRequest
from router.openai.completions import CompletionRequest
from router.openai.responses import ResponsesRequest
from router.routing.resolve import stickiness_key
from router.routing.router_model import request_text
from router.routing.spent import Spent
from router.routing.steps import JobIds
from switchboard.wire import ChatMessage


class Call:
    """A chat completion or a completion request, decoded and checked. A Responses request is its
    chat request (`router.intake.responses`), answered in the Responses shape (`responses`)."""

    def __init__(
        self,
        http: Request[Any, Any, Any],
        caller: Caller,
        user: str | None,
        *,
        chat: ChatCompletionRequest | None = None,
        completion: CompletionRequest | None = None,
        responses: ResponsesRequest | None = None,
        prompts: int = 1,
    ) -> None:
        self.http = http
        self.caller = caller
        self.chat = chat
        self.completion = completion
        self.responses = responses
        self.prompts = prompts
        self.stickiness_key = stickiness_key(http, user, caller)
        self.resume: ResumePoint | None = None
        self.ids = JobIds()
        self.spent = Spent()

    @property
    def stream(self) -> bool:
        return self.chat.stream if self.chat is not None else bool(self.completion and self.completion.stream)

    @property
    def wants_logprobs(self) -> bool:
        """Whether the client asked for log-probabilities in its answer."""
        if self.chat is not None:
            return self.chat.logprobs
        return self.completion is not None and self.completion.logprobs is not None

    @property
    def max_tokens_set(self) -> bool:
        """Whether the client bounded the answer's length itself (an answer ending there is whole)."""
        if self.chat is not None:
            return (self.chat.max_completion_tokens or self.chat.max_tokens) is not None
        # A completion's max_tokens defaults to 16, as OpenAI's: an answer cut there is whole too.
        return self.completion is not None and self.completion.max_tokens is not None

    def text(self, limit: int) -> str:
        """What a router model reads of the request (`router.routing.router_model.request_text`)."""
        if self.chat is not None:
            messages = [
                ChatMessage(role=m.role, content=None if m.content is None else m.text())
                for m in self.chat.messages
            ]
            return request_text(messages, None, limit)
        assert self.completion is not None
        prompt = self.completion.prompt
        return request_text(None, prompt if isinstance(prompt, str) else str(prompt), limit)
