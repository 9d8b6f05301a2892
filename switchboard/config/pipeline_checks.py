"""What makes a set of model pipelines one the configuration can hold: one shape each, steps of the
kinds that shape takes, and no name nested too deep or expanding to too many steps. The loader
checks the configured pipelines with these, and a front door checks an operator's change with them
(`router.routing.pipelines.pipeline_table`).

A name that leads back to itself is refused with the path of the loop (`switchboard.name_graph`),
and so is one that nests too deep or expands to too many steps (`check_nesting`): a request resolves
its name on the event loop, and two pipelines per level that each name both of the level below
expand as 2^depth, seconds of a blocked front door for a chain of twenty.
"""

from __future__ import annotations

import string
from collections.abc import Collection, Mapping

from switchboard.config.pipelines import CascadeConfig, PipelineConfig, RouterModelConfig
from switchboard.config.routes import RouteConfig

ROUTER_PLACEHOLDERS = frozenset({"targets", "request"})
# How many routes and pipelines a request may pass through on its way to a model, and how many
# names a route or pipeline may expand to when each of its steps is expanded in turn (a name named
# twice counts twice): far above any real pipeline (a fallback of three routes of three versions is
# 13), far below what would hold a front door's event loop for a noticeable time.
MAX_NESTING = 8
MAX_EXPANSION = 256


class PipelineError(ValueError):
    """A pipeline the configuration cannot hold; the message names it and says why."""


def check_pipelines(
    pipelines: Mapping[str, PipelineConfig], model_names: Collection[str], route_names: Collection[str]
) -> None:
    """PipelineError unless every pipeline has a free name, one shape, and steps of the kinds that
    shape takes. Loops are checked with the routes (`switchboard.name_graph`)."""
    for name, pipeline in pipelines.items():
        where = f"pipelines.{name}"
        if name in model_names or name in route_names:
            kind = "model" if name in model_names else "route"
            raise PipelineError(f"{where}: a pipeline may not take the name of a {kind}")
        names = _Names(model_names, route_names, pipelines, where)
        shapes = [pipeline.fallbacks != [], pipeline.router is not None, pipeline.cascade is not None]
        if sum(shapes) != 1:
            raise PipelineError(f"{where}: give exactly one of `fallbacks`, `router` or `cascade`")
        if pipeline.router is not None:
            _check_router(pipeline.router, names)
        elif pipeline.cascade is not None:
            _check_cascade(pipeline.cascade, names)
        else:
            _check_fallbacks(pipeline.fallbacks, names)


def leads_to(
    routes: Mapping[str, RouteConfig], pipelines: Mapping[str, PipelineConfig]
) -> dict[str, list[str]]:
    """Each route and pipeline with the names it may send a request to (`switchboard.name_graph`)."""
    return {
        **{name: list(route.targets) for name, route in routes.items()},
        **{name: pipeline.steps() for name, pipeline in pipelines.items()},
    }


def check_nesting(leads_to: Mapping[str, Collection[str]]) -> None:
    """PipelineError naming the first route or pipeline (of `leads_to`, as `leads_to()` makes it,
    loops already refused) that nests more than MAX_NESTING deep or expands to more than
    MAX_EXPANSION names. Each name is measured once, so this is linear in the graph's size."""
    sizes: dict[str, tuple[int, int]] = {}
    for name in leads_to:
        depth, expansion = _measure(name, leads_to, sizes)
        if depth > MAX_NESTING:
            raise PipelineError(
                f"{name}: leads through {depth} routes and pipelines in a row to a model; at most "
                f"{MAX_NESTING} may be nested. Name the models or the inner pipelines' steps directly."
            )
        if expansion > MAX_EXPANSION:
            raise PipelineError(
                f"{name}: expands to more than {MAX_EXPANSION} steps when each of its steps is "
                f"expanded in turn; at most {MAX_EXPANSION} may be reached. Name fewer pipelines that "
                "themselves name the same pipelines."
            )


def _measure(
    name: str, leads_to: Mapping[str, Collection[str]], sizes: dict[str, tuple[int, int]]
) -> tuple[int, int]:
    """How many routes and pipelines `name` leads through in a row at most, and how many names it
    expands to (itself included), each name measured once into `sizes`."""
    known = sizes.get(name)
    if known is not None:
        return known
    steps = leads_to.get(name)
    if not steps:
        return 0, 1  # a model
    sizes[name] = (0, 1)  # a loop (refused before) cannot recurse for ever
    measured = [_measure(step, leads_to, sizes) for step in steps]
    # Capped: the numbers past the bound only need to say "too many", not grow to 2^depth digits.
    size = (1 + max(depth for depth, _ in measured), min(1 + sum(n for _, n in measured), MAX_EXPANSION + 1))
    sizes[name] = size
    return size


def router_models(routes: Mapping[str, RouteConfig], pipelines: Mapping[str, PipelineConfig]) -> set[str]:
    """The models pipelines ask as routers (a router that is a route: each of its versions)."""
    named = {pipeline.router.model for pipeline in pipelines.values() if pipeline.router is not None}
    return {target for name in named for target in (routes[name].targets if name in routes else [name])}


class _Names:
    """The names a pipeline's steps may take, and the errors that name the step that is wrong."""

    def __init__(
        self,
        models: Collection[str],
        routes: Collection[str],
        pipelines: Mapping[str, PipelineConfig],
        where: str,
    ) -> None:
        self.models, self.routes, self.pipelines, self.where = models, routes, pipelines, where

    def require(self, step: str, field: str, *, pipelines: bool) -> None:
        """PipelineError unless `step` is a model or a route (or, if `pipelines`, a pipeline)."""
        if step in self.models or step in self.routes:
            return
        if step in self.pipelines:
            if pipelines:
                return
            raise PipelineError(
                f"{self.where}.{field}: names the pipeline {step!r}; it takes a model or a route"
            )
        raise PipelineError(
            f"{self.where}.{field}: {step!r} is no model, route or pipeline; models: "
            f"{', '.join(self.models)}; routes: {', '.join(self.routes) or 'none'}; "
            f"pipelines: {', '.join(self.pipelines)}"
        )


def _check_fallbacks(steps: list[str], names: _Names) -> None:
    if len(steps) < 2:
        raise PipelineError(f"{names.where}: fallbacks need at least two steps, not {steps}")
    repeated = sorted({s for s in steps if steps.count(s) > 1})
    if repeated:
        raise PipelineError(f"{names.where}: a step may appear once; repeated: {', '.join(repeated)}")
    for step in steps:
        names.require(step, "fallbacks", pipelines=True)
        inner = names.pipelines.get(step)
        if inner is not None and inner.shape != "fallbacks":
            raise PipelineError(
                f"{names.where}.fallbacks: {step!r} is a {inner.shape} pipeline; a fallback step is a "
                "model, a route or a pipeline of fallbacks"
            )


def _check_router(router: RouterModelConfig, names: _Names) -> None:
    names.require(router.model, "router.model", pipelines=False)
    if len(router.targets) < 2:
        raise PipelineError(f"{names.where}.router.targets: a router needs at least two targets")
    for label, target in router.targets.items():
        names.require(target.model, f"router.targets.{label}.model", pipelines=True)
    if router.default not in router.targets:
        raise PipelineError(
            f"{names.where}.router.default: {router.default!r} is no target's label; "
            f"labels: {', '.join(router.targets)}"
        )
    fields = {field for _, field, _, _ in string.Formatter().parse(router.prompt) if field is not None}
    if fields != ROUTER_PLACEHOLDERS:
        raise PipelineError(
            f"{names.where}.router.prompt: the prompt takes the placeholders {{targets}} and {{request}} "
            f"once each at least and no others; it has {', '.join(sorted(fields)) or 'none'} "
            "(write a literal brace twice: {{ }})"
        )
    for token in router.logit_bias or {}:
        if not token.isdigit():
            raise PipelineError(f"{names.where}.router.logit_bias: keys are token ids, not {token!r}")


def _check_cascade(cascade: CascadeConfig, names: _Names) -> None:
    names.require(cascade.draft, "cascade.draft", pipelines=False)
    names.require(cascade.strong, "cascade.strong", pipelines=True)
    if cascade.draft == cascade.strong:
        raise PipelineError(f"{names.where}.cascade: the draft and the strong model must differ")
