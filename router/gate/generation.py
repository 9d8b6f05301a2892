"""The gates of the generation endpoints: chat completions, completions and responses.

Each applies its type's field checks (`router.openai.checks`) and the bounds on what one request
may cost a worker (`router.openai.bounds`). A Responses request is bounded as the chat request that
answers it (`router.gate.responses_as_chat`), since that is what the engine runs: whatever a response can
say, its bounds are the chat's, named in the Responses request's own words.
"""

from __future__ import annotations

import msgspec

from router.gate.asks import ChatAsk, CompletionAsk, ResponsesAsk
from router.gate.gate import Gate
from router.gate.responses_as_chat import chat_request, in_responses_terms
from router.intake.request_images import images_of
from router.openai.bounds import check_chat_bounds, check_sampling_bounds
from router.openai.chat import ChatCompletionRequest
from router.openai.checks import check_chat, check_completion
from router.openai.completions import CompletionRequest
from router.openai.errors import InvalidRequestError
from router.openai.responses import ResponsesRequest
from switchboard.config import FrontDoorConfig


def checked_chat(chat: ChatCompletionRequest, bounds: FrontDoorConfig) -> ChatAsk:
    """A chat request within the bounds (what it may cost first: it is the cheaper refusal)."""
    check_chat_bounds(chat, bounds)
    check_chat(chat)
    return ChatAsk(chat=chat, images=images_of(chat, bounds))


def checked_completion(completion: CompletionRequest, bounds: FrontDoorConfig) -> CompletionAsk:
    check_sampling_bounds(completion, bounds)
    prompts = check_completion(completion)
    return CompletionAsk(completion, prompts)


def checked_responses(responses: ResponsesRequest, bounds: FrontDoorConfig) -> ResponsesAsk:
    """A Responses request whose chat request is within the chat's bounds."""
    try:
        chat = chat_request(responses)
        check_chat_bounds(chat, bounds)
        images = images_of(chat, bounds)
    except InvalidRequestError as error:
        raise in_responses_terms(error) from None
    return ResponsesAsk(chat=chat, images=images, responses=responses)


CHAT = Gate("chat completions", msgspec.json.Decoder(ChatCompletionRequest), checked_chat)
COMPLETIONS = Gate("completions", msgspec.json.Decoder(CompletionRequest), checked_completion)
RESPONSES = Gate("responses", msgspec.json.Decoder(ResponsesRequest), checked_responses)
