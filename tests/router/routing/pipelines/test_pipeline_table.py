"""The pipelines a front door knows, the config's with the admin API's over them, against a real Redis:
what a change must pass, how it reaches another front door's table, what deleting takes back, and
what a stored definition that does not fit is."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import redis.asyncio as aioredis

from router.routing.pipelines.pipeline_table import PipelineConflict, PipelineTable, UnknownPipeline
from switchboard import keys
from switchboard.config import CascadeConfig, PipelineConfig, RouteConfig, RouterModelConfig, RouterTarget
from switchboard.config.pipeline_checks import PipelineError
from switchboard.name_graph import LoopError

MODELS = ["big", "small", "coder"]
# The route `chat` sends a share of its callers to the configured pipeline `resilient`.
ROUTES = {"chat": RouteConfig(targets={"big": 90, "resilient": 10})}
CONFIGURED = {"resilient": PipelineConfig(fallbacks=["big", "small"])}


def table(redis: aioredis.Redis) -> PipelineTable:
    return PipelineTable(redis, CONFIGURED, models=MODELS, routes=ROUTES)


def fallbacks(*steps: str) -> PipelineConfig:
    return PipelineConfig(fallbacks=list(steps))


def picker(otherwise: str = "resilient") -> PipelineConfig:
    targets = {
        "code": RouterTarget(model="coder", description="programming"),
        "chat": RouterTarget(model=otherwise, description="everything else"),
    }
    return PipelineConfig(router=RouterModelConfig(model="small", targets=targets, default="chat"))


async def test_the_configs_pipelines_apply_until_redis_holds_others_and_a_change_reaches_another_table(
    redis: aioredis.Redis,
) -> None:
    first, second = table(redis), table(redis)
    assert first.get("resilient") == CONFIGURED["resilient"] and first.names() == ["resilient"]
    await second.refresh()

    entry = await first.put("picker", picker())
    assert entry.source == "admin" and entry.config.shape == "router"
    assert first.names() == ["resilient", "picker"]
    await first.put("resilient", fallbacks("small", "big"))
    assert second.get("picker") is None  # until its next poll
    await second.refresh()
    assert second.get("picker") == picker()
    assert second.get("resilient") == fallbacks("small", "big")
    override = second.entry("resilient")
    assert override is not None and override.source == "admin"

    # Deleting takes back what the admin API set: the config's definition returns, a new one goes.
    back = await second.remove("resilient")
    assert back is not None and back.source == "config" and back.config == CONFIGURED["resilient"]
    assert await second.remove("picker") is None
    await first.refresh()
    assert first.items() == list(CONFIGURED.items())
    assert await redis.hlen(keys.pipelines()) == 0  # type: ignore[misc]
    with pytest.raises(UnknownPipeline):
        await first.remove("picker")
    # The configured one has the config's definition already: nothing to take back.
    unchanged = await first.remove("resilient")
    assert unchanged is not None and unchanged.source == "config"


async def test_a_definition_that_would_make_a_loop_with_the_routes_is_refused_with_its_path(
    redis: aioredis.Redis,
) -> None:
    pipelines = table(redis)
    with pytest.raises(LoopError, match=r"chat -> resilient -> chat|resilient -> chat -> resilient"):
        await pipelines.put("resilient", fallbacks("chat", "small"))
    await pipelines.put("outer", fallbacks("resilient", "small"))
    with pytest.raises(LoopError, match="resilient -> outer -> resilient"):
        await pipelines.put("resilient", fallbacks("outer", "big"))
    with pytest.raises(LoopError, match="new -> new"):
        await pipelines.put("new", fallbacks("new", "big"))
    assert pipelines.get("resilient") == CONFIGURED["resilient"]
    assert list(await redis.hkeys(keys.pipelines())) == [b"outer"]  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "config", "message"),
    [
        ("big", fallbacks("small", "coder"), "may not take the name of a model"),
        ("chat", fallbacks("small", "coder"), "may not take the name of a route"),
        ("p", fallbacks("small", "nothing"), "'nothing' is no model, route or pipeline"),
        ("p", fallbacks("small"), "at least two steps"),
        ("p", PipelineConfig(), "exactly one of"),
        ("p", PipelineConfig(cascade=CascadeConfig(draft="resilient", strong="big")), "cascade.draft"),
    ],
)
async def test_a_definition_the_config_could_not_hold_is_refused_and_nothing_changes(
    redis: aioredis.Redis, name: str, config: PipelineConfig, message: str
) -> None:
    pipelines = table(redis)
    with pytest.raises(PipelineError, match=message):
        await pipelines.put(name, config)
    assert await redis.exists(keys.pipelines(), keys.pipelines_version()) == 0
    assert pipelines.names() == ["resilient"]


async def test_a_pipeline_others_name_cannot_be_deleted_nor_change_into_a_shape_they_cannot_name(
    redis: aioredis.Redis,
) -> None:
    pipelines = table(redis)
    await pipelines.put("inner", fallbacks("small", "coder"))
    await pipelines.put("outer", fallbacks("inner", "big"))
    await pipelines.put("resilient", fallbacks("inner", "big"))
    with pytest.raises(PipelineConflict, match="named by pipeline 'resilient', pipeline 'outer'"):
        await pipelines.remove("inner")
    with pytest.raises(PipelineError, match="'inner' is a router pipeline"):
        await pipelines.put("inner", picker())
    await pipelines.remove("resilient")  # the configured one names no `inner`
    with pytest.raises(PipelineConflict, match="named by pipeline 'outer'"):
        await pipelines.remove("inner")
    assert pipelines.get("inner") == fallbacks("small", "coder")
    assert await redis.hlen(keys.pipelines()) == 2  # type: ignore[misc]


async def test_a_configured_pipeline_cannot_return_to_a_definition_that_no_longer_fits(
    redis: aioredis.Redis,
) -> None:
    # `backup` is configured to fall back on `resilient`; both are then changed through the admin API.
    configured = {**CONFIGURED, "backup": fallbacks("resilient", "coder")}
    pipelines = PipelineTable(redis, configured, models=MODELS, routes=ROUTES)
    await pipelines.put("backup", fallbacks("coder", "small"))
    await pipelines.put("resilient", fallbacks("backup", "big"))
    with pytest.raises(PipelineConflict, match=r"configured definition: .*resilient -> backup -> resilient"):
        await pipelines.remove("backup")
    await pipelines.put("resilient", picker(otherwise="big"))
    with pytest.raises(PipelineConflict, match="'resilient' is a router pipeline"):
        await pipelines.remove("backup")
    assert pipelines.get("backup") == fallbacks("coder", "small")


async def test_two_front_doors_changing_pipelines_at_once_cannot_together_make_a_loop(
    redis: aioredis.Redis,
) -> None:
    first, second = table(redis), table(redis)
    await first.put("a", fallbacks("big", "small"))
    await first.put("b", fallbacks("small", "big"))
    await second.refresh()
    # Each alone is fine; both would make a -> b -> a.
    results = await asyncio.gather(
        first.put("a", fallbacks("b", "big")),
        second.put("b", fallbacks("a", "small")),
        return_exceptions=True,
    )
    assert sum(isinstance(result, LoopError) for result in results) == 1, results
    await first.refresh()
    await second.refresh()
    assert first.items() == second.items()


async def test_stored_definitions_that_do_not_fit_this_config_are_left_out(redis: aioredis.Redis) -> None:
    await redis.hset(  # type: ignore[misc]
        keys.pipelines(),
        mapping={
            "other": msgspec.json.encode(fallbacks("elsewhere", "big")),  # a model this config lacks
            "garbled": b"{not json",
            "later": msgspec.json.encode(fallbacks("zz-first", "big")),  # names one read after it
            "zz-first": msgspec.json.encode(fallbacks("small", "coder")),
        },
    )
    await redis.set(keys.pipelines_version(), "v1")
    pipelines = table(redis)
    await pipelines.refresh()
    assert pipelines.names() == ["resilient", "later", "zz-first"]
    # What cannot be read can still be deleted; what does not fit is deleted like any other.
    assert await pipelines.remove("garbled") is None and await pipelines.remove("other") is None
    assert sorted(await redis.hkeys(keys.pipelines())) == [b"later", b"zz-first"]  # type: ignore[misc]
