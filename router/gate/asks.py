"""What a request asks, as its gate passes it on: one type per kind of request, each holding the
decoded body and what its checks found out (a completion's prompt count, a response's chat request,
a pooling request's inputs). The request's steps take an ask and never test for optional parts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from router.intake.request_images import RequestImage
from router.openai.chat import ChatCompletionRequest
from router.openai.classify import ClassificationRequest
from router.openai.completions import CompletionRequest
from router.openai.embeddings import EmbeddingRequest
from router.openai.rerank import RerankRequest
from router.openai.responses import ResponsesRequest
from switchboard.wire import Prompt


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatAsk:
    """A chat completion (and what a Responses request amounts to: `ResponsesAsk`)."""

    # The API, as errors name it ("the chat completions API").
    api: ClassVar[str] = "chat completions"
    chat: ChatCompletionRequest
    # Its messages' images in order, data URLs checked, remote ones to fetch once its model is known.
    images: tuple[RequestImage, ...] = ()

    @property
    def model(self) -> str:
        return self.chat.model

    @property
    def stream(self) -> bool:
        return self.chat.stream

    @property
    def user(self) -> str | None:
        return self.chat.user

    @property
    def wants_logprobs(self) -> bool:
        """Whether the client asked for log-probabilities in its answer."""
        return self.chat.logprobs

    @property
    def max_tokens_set(self) -> bool:
        """Whether the client bounded the answer's length itself (an answer ending there is whole)."""
        return (self.chat.max_completion_tokens or self.chat.max_tokens) is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponsesAsk(ChatAsk):
    """A Responses request: answered by its chat request (`chat`), in the Responses shape."""

    api: ClassVar[str] = "responses"
    responses: ResponsesRequest


@dataclass(frozen=True, slots=True)
class CompletionAsk:
    """A plain completion, and how many prompts it holds."""

    api: ClassVar[str] = "completions"
    completion: CompletionRequest
    prompts: int

    @property
    def model(self) -> str:
        return self.completion.model

    @property
    def stream(self) -> bool:
        return self.completion.stream

    @property
    def user(self) -> str | None:
        return self.completion.user

    @property
    def wants_logprobs(self) -> bool:
        return self.completion.logprobs is not None

    @property
    def max_tokens_set(self) -> bool:
        # A completion's max_tokens defaults to 16, as OpenAI's: an answer cut there is whole too.
        return self.completion.max_tokens is not None


GenerationAsk = ChatAsk | CompletionAsk


@dataclass(frozen=True, slots=True)
class EmbeddingsAsk:
    body: EmbeddingRequest
    inputs: tuple[Prompt, ...]


@dataclass(frozen=True, slots=True)
class ClassificationAsk:
    body: ClassificationRequest
    inputs: tuple[Prompt, ...]


@dataclass(frozen=True, slots=True)
class RerankAsk:
    body: RerankRequest
    documents: tuple[str, ...]
