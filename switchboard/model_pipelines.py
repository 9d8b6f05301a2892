"""Model pipelines: a configured name that clients call like a model, answered by several models.

The first shape is a chain of fallbacks: `[pipelines.NAME] fallbacks = ["big", "small"]` answers
with the first step that does not fail before its first byte (`router.routing.fallback`). A step
names a model or a route (whose weights and stickiness then place the caller on one of its
versions). A pipeline's name is none of a model's or a route's, and a key allowed the pipeline may
use its steps through it.

Steps name models and routes only, and routes name models only, so no configuration can loop.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import msgspec

from switchboard.config_names import ModelName


class PipelineError(ValueError):
    """A pipeline the configuration cannot hold; the message names it and says why."""


class PipelineConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One pipeline: for now, an ordered chain of fallbacks (at least two steps)."""

    # Tried in this order: the next answers when the one before fails before its first byte.
    fallbacks: list[ModelName]

    def steps(self) -> list[str]:
        """Every model or route the pipeline may send a request to, in order."""
        return list(self.fallbacks)


def check_pipelines(
    pipelines: Mapping[str, PipelineConfig], model_names: Collection[str], route_names: Collection[str]
) -> None:
    """PipelineError unless every pipeline has a free name and at least two known, distinct steps."""
    for name, pipeline in pipelines.items():
        where = f"pipelines.{name}"
        if name in model_names or name in route_names:
            kind = "model" if name in model_names else "route"
            raise PipelineError(f"{where}: a pipeline may not take the name of a {kind}")
        steps = pipeline.steps()
        if len(steps) < 2:
            raise PipelineError(f"{where}: fallbacks need at least two steps, not {steps}")
        repeated = sorted({s for s in steps if steps.count(s) > 1})
        if repeated:
            raise PipelineError(f"{where}: a step may appear once; repeated: {', '.join(repeated)}")
        unknown = [s for s in steps if s not in model_names and s not in route_names]
        if unknown:
            inner = [s for s in unknown if s in pipelines]
            if inner:
                raise PipelineError(
                    f"{where}: a step may name a model or a route, not a pipeline: {', '.join(inner)}"
                )
            raise PipelineError(
                f"{where}: steps name unknown models or routes: {', '.join(unknown)}; "
                f"models: {', '.join(model_names)}; routes: {', '.join(route_names) or 'none'}"
            )
