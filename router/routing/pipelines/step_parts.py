"""What the steps of a model pipeline use of the front door, and nothing more: where a step's name
resolves, how its job is queued and its answer relayed, which targets are warm, and the deadline.
Steps are functions of these parts (`router.routing.pipelines.router_step`, `router.routing.pipelines.cascade_step`);
none of them holds the request's flow (`router.flow`), which alone runs steps in order."""

from __future__ import annotations

from dataclasses import dataclass

from router.queue.starts import JobRuns
from router.relay.answer import Relaying
from router.routing.call import Call
from router.routing.resolve import Resolution, resolve_step
from router.routing.routes.route_table import RouteTable
from router.status.model_status import ModelStatusReader
from router.status.redis_health import RedisHealth
from switchboard.config import PipelineLookup


@dataclass(frozen=True, slots=True)
class StepParts:
    routes: RouteTable
    pipelines: PipelineLookup
    runs: JobRuns
    relaying: Relaying
    status: ModelStatusReader
    health: RedisHealth
    timeout_s: float

    def step(self, call: Call, step: str, within: Resolution) -> Resolution:
        """What serves a pipeline's step `step` for `call` (`router.routing.resolve.resolve_step`)."""
        return resolve_step(self.routes, self.pipelines, step, call.stickiness_key, within)
