"""What the steps of a pipeline share beyond one job: the ids of a request's jobs, the headers that
say what happened, a cascade's draft as its job is asked for, and each step's span and metrics."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Histogram

from router.telemetry.requests import arrival_id, new_request_id
from switchboard import tracing
from switchboard.config import CascadeConfig
from switchboard.metrics import REGISTRY

if TYPE_CHECKING:
    from router.routing.pipelines.cascade import DraftVerdict
    from router.routing.pipelines.router_model import RouterChoice

# Headers of a pipeline's answer (beside x-switchboard-model, -route and -pipeline).
ROUTER_HEADER = "x-switchboard-router"  # the router model that chose
CHOICE_HEADER = "x-switchboard-router-choice"  # the label it chose, and how ("code; warm")
CASCADE_HEADER = "x-switchboard-cascade"  # "accepted" (the draft answered) or "escalated"
DRAFT_HEADER = "x-switchboard-draft"  # the draft model, when it was not kept

STEPS = Counter(
    "switchboard:pipeline_steps",
    "Steps of pipelines run: a router's choice (outcome router, warm: a warm target close to the best "
    "one, default: the router failed or was too slow) and a cascade's draft (outcome accepted, "
    "rejected, failed, too_slow), by pipeline and the model of the step.",
    ["pipeline", "step", "model", "outcome"],
    registry=REGISTRY,
)
STEP_SECONDS = Histogram(
    "switchboard:pipeline_step_seconds",
    "How long a pipeline's step took before the answer's own job was queued: the router's choice, "
    "a cascade's draft (kept or not).",
    ["pipeline", "step"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)


class JobIds:
    """The ids of one request's jobs: the first takes the request's own id (which x-request-id
    names), each later one a new id — reusing one would race with the cleanup of the job before."""

    def __init__(self) -> None:
        self._first: str | None = arrival_id()
        self._taken = False

    def next(self) -> str | None:
        if not self._taken:
            self._taken = True
            return self._first
        return new_request_id()


@contextmanager
def step_span(name: str, attributes: dict[str, Any]) -> Iterator[Any]:
    """A span around one step of a pipeline (its jobs' spans nest inside); None when tracing is off."""
    with tracing.span(name, attributes) as span:
        yield span


def set_attributes(span: Any, attributes: dict[str, Any]) -> None:
    if span is not None:
        for name, value in attributes.items():
            if value is not None:
                span.set_attribute(name, value)


class Draft:
    """What a cascade asks of its draft's job (`router.routing.pipelines.cascade`): to be held and judged."""

    def __init__(self, pipeline: str, config: CascadeConfig) -> None:
        self.pipeline = pipeline
        self.min_mean_logprob = config.min_mean_logprob
        self.hold_s = config.hold_s
        self.model: str | None = None  # the model that drafted, once its job is made


class DraftRejected(Exception):
    """A cascade's draft that is not kept: why (`verdict`), and the outcome its metric counts."""

    def __init__(self, verdict: DraftVerdict, outcome: str) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict
        self.outcome = outcome


def choice_attributes(choice: RouterChoice) -> dict[str, Any]:
    """A router's choice as span attributes: the label, how it was chosen, why (for the default),
    and each label's share of the router's belief."""
    attributes: dict[str, Any] = {
        "switchboard.router.label": choice.label,
        "switchboard.router.target": choice.target,
        "switchboard.router.chosen_by": choice.chosen_by,
        "switchboard.router.reason": choice.reason,
    }
    for label, share in choice.scores.items():
        attributes[f"switchboard.router.score.{label}"] = round(share, 4)
    return attributes
