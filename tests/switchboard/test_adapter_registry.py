"""Adapters registered at run time (switchboard/adapter_registry.py) against a real Redis: what one
process registers another reads within a poll, the checks made at start apply to each registration,
and a poll while nothing changes costs one GET whatever the number registered."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from switchboard.adapter_registry import AdapterExists, AdapterRegistry
from switchboard.config import ConfigError, LoraConfig, ModelConfig

BASE = ModelConfig(name="base", path="/models/base", lora=LoraConfig())
NO_LORA = ModelConfig(name="plain", path="/models/plain")
EMBEDDER = ModelConfig(name="embedder", path="/models/e", kind="embed", lora=None)
CONFIGURED = [BASE, NO_LORA, EMBEDDER]


def adapter(name: str, **fields: object) -> ModelConfig:
    return ModelConfig(**{"name": name, "base": "base", "path": f"/adapters/{name}", **fields})  # type: ignore[arg-type]


async def test_what_one_process_registers_another_reads_and_is_told(redis: aioredis.Redis) -> None:
    front_door, worker = AdapterRegistry(redis, CONFIGURED), AdapterRegistry(redis, CONFIGURED)
    told: list[tuple[list[str], list[str]]] = []
    worker.on_change(lambda added, removed: told.append(([a.name for a in added], removed)))
    await worker.refresh()

    await front_door.add(adapter("acme/ft-1", keep_alive_s=30))
    assert "acme/ft-1" in front_door.registered()  # at once where it was registered
    await worker.refresh()
    assert worker.registered()["acme/ft-1"] == adapter("acme/ft-1", keep_alive_s=30)
    assert told == [(["acme/ft-1"], [])]

    assert await front_door.remove("acme/ft-1")
    assert not await front_door.remove("acme/ft-1")
    await worker.refresh()
    assert dict(worker.registered()) == {}
    assert told[-1] == ([], ["acme/ft-1"])


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (adapter("x", base=None), "`base` names the generator"),
        (adapter("x", base="nowhere"), "not a configured model"),
        (adapter("x", base="plain"), "give its [[models]] entry a [models.lora] table"),
        (adapter("x", base="embedder"), "LoRA adapters are served on generators of vLLM or TensorRT-LLM"),
        (adapter("x", engine_args={"seed": 1}), "remove engine_args (set them on 'base')"),
        (adapter("x", path="s3://"), "path"),
    ],
)
async def test_a_registration_the_config_could_not_hold_is_refused(
    redis: aioredis.Redis, entry: ModelConfig, message: str
) -> None:
    registry = AdapterRegistry(redis, CONFIGURED)
    with pytest.raises(ConfigError) as refused:
        await registry.add(entry)
    assert message in str(refused.value)
    assert await redis.hlen("sb:adapters") == 0  # type: ignore[misc]


async def test_a_name_in_use_is_refused(redis: aioredis.Redis) -> None:
    registry, other = AdapterRegistry(redis, CONFIGURED), AdapterRegistry(redis, CONFIGURED)
    await registry.add(adapter("ft"))
    for name, taken in (("ft", ()), ("base", ()), ("a-route", ("a-route",))):
        with pytest.raises(AdapterExists):
            await registry.add(adapter(name), taken=taken)
    with pytest.raises(AdapterExists):  # registered by another process since this one last read
        await other.add(adapter("ft"))


async def test_an_entry_that_does_not_fit_this_config_is_left_out(redis: aioredis.Redis) -> None:
    other_config = [ModelConfig(name="other-base", path="/m", lora=LoraConfig())]
    await AdapterRegistry(redis, other_config).add(adapter("theirs", base="other-base"))
    mine = AdapterRegistry(redis, CONFIGURED)
    await mine.add(adapter("ours"))
    assert list(mine.registered()) == ["ours"]


async def test_an_unchanged_registry_costs_one_get_per_poll_however_many_are_registered(
    redis: aioredis.Redis,
) -> None:
    registry = AdapterRegistry(redis, CONFIGURED)
    for n in range(1000):
        await registry.add(adapter(f"ft-{n}"))
    reader = AdapterRegistry(redis, CONFIGURED)
    await reader.refresh()
    assert len(reader.registered()) == 1000
    before = await redis.info("commandstats")
    for _ in range(10):
        await reader.refresh()
    after = await redis.info("commandstats")

    def calls(info: dict[str, dict[str, int]], command: str) -> int:
        return info.get(f"cmdstat_{command}", {}).get("calls", 0)

    assert calls(after, "get") - calls(before, "get") == 10
    assert calls(after, "hgetall") == calls(before, "hgetall")
