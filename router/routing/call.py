"""One API request as the steps of its pipeline see it: what it asked (the ask its gate passed on),
who asked, and what its earlier steps left for the later ones (the ids of its jobs, the tokens they
spent)."""

from __future__ import annotations

from typing import Any

from litestar import Request

from router.admission.auth import Caller
from router.gate.asks import GenerationAsk
from router.intake.resume import ResumePoint
from router.routing.pipelines.spent_tokens import Spent
from router.routing.pipelines.steps import JobIds
from router.routing.resolve import stickiness_key
from switchboard.wire import ImageInput


class Call:
    """A chat completion, a completion or a response, past its gate, and what its steps carry."""

    def __init__(self, http: Request[Any, Any, Any], caller: Caller, ask: GenerationAsk) -> None:
        self.http = http
        self.caller = caller
        self.ask = ask
        self.stickiness_key = stickiness_key(http, ask.user, caller)
        self.resume: ResumePoint | None = None
        self.ids = JobIds()
        self.spent = Spent()
        # The request's images as its jobs carry them, fetched for the first model that takes them.
        self.images: tuple[ImageInput, ...] | None = None

    @property
    def stream(self) -> bool:
        return self.ask.stream

    @property
    def wants_logprobs(self) -> bool:
        """Whether the client asked for log-probabilities in its answer."""
        return self.ask.wants_logprobs

    @property
    def max_tokens_set(self) -> bool:
        """Whether the client bounded the answer's length itself (an answer ending there is whole)."""
        return self.ask.max_tokens_set
