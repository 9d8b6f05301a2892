"""Model pipelines: a configured name that clients call like a model, answered by several models.

Three shapes, one per pipeline:

- **fallbacks** — `fallbacks = ["big", "small"]`: the first step that does not fail before its first
  byte answers (`router.routing.fallback`).
- **router** — `[pipelines.NAME.router]`: a small model chooses, per request, one of described
  targets (a constrained `choice` among their labels); a warm target close to the best wins over a
  cold one; a router that fails or is too slow leaves the choice to `default`
  (`router.routing.pipelines.router_model`).
- **cascade** — `[pipelines.NAME.cascade]`: a cheap draft model answers first; its answer is kept
  when it finished normally, fits the requested structure and is confident enough (mean token
  log-probability), else the strong model answers afresh (`router.routing.pipelines.cascade`).

A step names a model, a route (whose weights and stickiness place the caller on one of its
versions) or, where the shape allows, another pipeline; routes may name pipelines too. What makes a
set of pipelines one the configuration can hold (no loop, no nesting past the bounds) is
`switchboard.config.pipeline_checks`.
"""

from __future__ import annotations

from typing import Annotated, Literal, Protocol

import msgspec

from switchboard.config.names import ModelName

Shape = Literal["fallbacks", "router", "cascade"]

# What the router model reads: the targets described, one per line ("- label: description"), and
# the request's text (its last user message, or its prompt), cut to `request_chars`.
DEFAULT_ROUTER_PROMPT = (
    "You choose which assistant answers a request. The assistants:\n"
    "{targets}\n\n"
    "The request:\n{request}\n\n"
    "Answer with the label of the assistant that suits the request best."
)


class RouterTarget(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One target a router model may choose: what it answers with, and what the router reads of it."""

    # A model, a route or another pipeline.
    model: ModelName
    # Shown to the router model beside the target's label.
    description: str


class RouterModelConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A router model's choice between targets (`router.routing.pipelines.router_model`)."""

    # The router: a model or a route (its answer's log-probabilities weigh the targets).
    model: ModelName
    # Label -> target. The router's answer is constrained to one of the labels.
    targets: dict[Annotated[str, msgspec.Meta(min_length=1, max_length=64)], RouterTarget]
    # The label taken when the router fails, is too slow, or no target can be told apart.
    default: str
    # The router's instructions, with the placeholders {targets} and {request}.
    prompt: str = DEFAULT_ROUTER_PROMPT
    # The router's whole answer (queue, load, generation) must come within this, else `default`.
    timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 2.0
    # A warm target whose share of the router's belief is within this of the best target's wins
    # over the best one when that is cold (0: never; 1: any warm target the router considered).
    warm_margin: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.1
    # The request's text shown to the router is cut to this many characters (its end is kept).
    request_chars: Annotated[int, msgspec.Meta(ge=1)] = 4000
    # Biases on the router's token ids (as OpenAI's `logit_bias`), to nudge its choices.
    logit_bias: dict[str, Annotated[float, msgspec.Meta(ge=-100, le=100)]] | None = None


class CascadeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A draft model answering first, and a strong model answering when the draft is not kept
    (`router.routing.pipelines.cascade`)."""

    # The cheap model: a model or a route.
    draft: ModelName
    # The strong model: a model, a route or another pipeline.
    strong: ModelName
    # The draft is kept only when the mean log-probability of its tokens is at least this.
    min_mean_logprob: Annotated[float, msgspec.Meta(le=0)] = -1.0
    # How long a streamed cascade holds the draft before the client sees anything; a draft not
    # finished by then is dropped and the strong model answers (a non-streamed one waits for it).
    hold_s: Annotated[float, msgspec.Meta(gt=0)] = 10.0


class PipelineConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One pipeline, of exactly one shape."""

    # Tried in this order: the next answers when the one before fails before its first byte.
    fallbacks: list[ModelName] = msgspec.field(default_factory=list)
    router: RouterModelConfig | None = None
    cascade: CascadeConfig | None = None

    @property
    def shape(self) -> Shape:
        if self.router is not None:
            return "router"
        if self.cascade is not None:
            return "cascade"
        return "fallbacks"

    def steps(self) -> list[str]:
        """Every model, route or pipeline the pipeline may send a request to, in order."""
        if self.router is not None:
            return [self.router.model, *(target.model for target in self.router.targets.values())]
        if self.cascade is not None:
            return [self.cascade.draft, self.cascade.strong]
        return list(self.fallbacks)


class PipelineLookup(Protocol):
    """Where a front door finds a pipeline by name: the config's, or the live table that admin
    changes reach (`router.routing.pipelines.pipeline_table`)."""

    def get(self, name: str, /) -> PipelineConfig | None: ...
