"""Resolving a name through pipelines and routes: each name is placed once per request, so pipelines
that name the same pipelines cost a walk of the graph, not of every path through it."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from router.admission.auth import ANONYMOUS
from router.routing.resolve import resolve
from router.routing.routes.route_table import RouteTable
from switchboard.config import PipelineConfig, RouteConfig


def pairs(levels: int) -> dict[str, PipelineConfig]:
    """Two pipelines per level, each naming both of the level below (2^levels paths from the top);
    the config's bounds would refuse this, so it is built here as a lookup of its own."""
    found = {
        "a0": PipelineConfig(fallbacks=["route", "small"]),
        "b0": PipelineConfig(fallbacks=["small", "big"]),
    }
    for level in range(1, levels):
        below = [f"a{level - 1}", f"b{level - 1}"]
        found[f"a{level}"] = PipelineConfig(fallbacks=below)
        found[f"b{level}"] = PipelineConfig(fallbacks=below[::-1])
    return found


async def test_pipelines_that_name_the_same_pipelines_resolve_in_one_walk_in_their_order() -> None:
    routes = RouteTable(aioredis.Redis(), {"route": RouteConfig(targets={"big": 100, "canary": 0})})
    shallow = resolve(routes, pairs(3), "a2", ANONYMOUS, "session:s")
    # Fallbacks in order, each model once: a0's route (its version big), then small.
    assert (shallow.served, [model for model, _ in shallow.later]) == ("big", ["small"])
    assert shallow.route is not None and shallow.route.name == "route" and shallow.later[0][1] is None

    started = time.perf_counter()
    deep = resolve(routes, pairs(40), "a39", ANONYMOUS, "session:s")
    took_s = time.perf_counter() - started
    assert (deep.served, deep.later) == (shallow.served, shallow.later)
    # 2^40 paths: walked one by one, this would not end; each name placed once, milliseconds.
    assert took_s < 0.1, f"resolving took {took_s:.3f} s"
