"""Model routes: sticky bucketing, placement by weight, weight checks, the config's routes table,
and the route record in a real Redis."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import given
from hypothesis import strategies as st

from switchboard import keys, routes
from switchboard.config import ConfigError, load_settings
from switchboard.local.redis_server import PrivateRedis
from switchboard.rollout import RolloutPlan, decode_state
from switchboard.routes import (
    BUCKETS,
    ROLLOUT_FIELD,
    VERSION_FIELD,
    WATCH_ATTEMPTS,
    RolloutConflict,
    Route,
    WeightsError,
    bucket,
    checked_weights,
    pick_target,
    route_from_fields,
    seed_route,
    start_rollout,
    write_weights,
)

ROUTED = """
[[models]]
name = "chat-v1"
path = "/m/1"

[[models]]
name = "chat-v2"
path = "/m/2"

[routes.chat]
targets = {"chat-v1" = 90, "chat-v2" = 10}
"""


def test_a_bucket_is_the_same_for_the_same_route_and_key_and_spreads_over_all_buckets() -> None:
    assert bucket("chat", "user:ada") == bucket("chat", "user:ada")
    assert 0 <= bucket("chat", "user:ada") < BUCKETS
    spread = Counter(bucket("chat", f"user:{n}") * 10 // BUCKETS for n in range(10_000))
    assert len(spread) == 10 and min(spread.values()) > 900  # ten deciles, each near 1,000


def test_the_route_is_part_of_the_hash_so_routes_place_one_caller_independently() -> None:
    pairs = [(bucket("chat", f"k{n}"), bucket("code", f"k{n}")) for n in range(200)]
    assert sum(a == b for a, b in pairs) < 5


def test_targets_take_cumulative_ranges_in_their_fixed_order() -> None:
    targets = ("stable", "canary")
    assert pick_target(targets, (90, 10), 0) == "stable"
    assert pick_target(targets, (90, 10), 8999) == "stable"
    assert pick_target(targets, (90, 10), 9000) == "canary"
    assert pick_target(targets, (90, 10), BUCKETS - 1) == "canary"
    assert pick_target(targets, (0, 100), 0) == "canary"
    assert pick_target(targets, (100, 0), BUCKETS - 1) == "stable"


@given(
    at=st.integers(min_value=0, max_value=BUCKETS - 1),
    before=st.integers(min_value=0, max_value=100),
    raise_by=st.integers(min_value=0, max_value=100),
)
def test_raising_the_canarys_weight_only_moves_callers_from_stable_to_canary(
    at: int, before: int, raise_by: int
) -> None:
    after = min(100, before + raise_by)
    targets = ("stable", "canary")
    was = pick_target(targets, (100 - before, before), at)
    now = pick_target(targets, (100 - after, after), at)
    assert not (was == "canary" and now == "stable")


@given(
    at=st.integers(min_value=0, max_value=BUCKETS - 1),
    weights=st.lists(st.integers(min_value=0, max_value=100), min_size=3, max_size=3).filter(
        lambda w: sum(w) <= 100
    ),
    moved=st.integers(min_value=0, max_value=100),
)
def test_with_three_targets_weight_moved_from_first_to_last_moves_callers_only_forward(
    at: int, weights: list[int], moved: int
) -> None:
    first, middle, last = 100 - weights[1] - weights[2], weights[1], weights[2]
    moved = min(moved, first)
    targets = ("a", "b", "c")
    was = pick_target(targets, (first, middle, last), at)
    now = pick_target(targets, (first - moved, middle, last + moved), at)
    assert targets.index(now) >= targets.index(was)  # callers move only towards the end of the order


def test_weights_must_name_every_target_once_as_whole_percents_summing_to_100() -> None:
    targets = ("a", "b")
    assert checked_weights(targets, {"b": 30, "a": 70}) == (70, 30)
    wrongs: list[tuple[dict[str, object], str]] = [
        ({"a": 70, "b": 20}, "sum to 100"),
        ({"a": 100}, "missing: b"),
        ({"a": 50, "b": 40, "c": 10}, "not targets of this route: c"),
        ({"a": 50.0, "b": 50}, "whole percent"),
        ({"a": True, "b": 99}, "whole percent"),
        ({"a": "50", "b": 50}, "whole percent"),
        ({"a": 150, "b": -50}, "whole percent"),
    ]
    for wrong, says in wrongs:
        with pytest.raises(WeightsError, match=says):
            checked_weights(targets, wrong)


def test_the_config_reads_routes_in_their_order(tmp_path: Path) -> None:
    path = tmp_path / "sb.toml"
    path.write_text(ROUTED)
    settings = load_settings(path, environ={})
    assert list(settings.routes["chat"].targets.items()) == [("chat-v1", 90), ("chat-v2", 10)]


@pytest.mark.parametrize(
    ("routes", "says"),
    [
        ('[routes.chat-v1]\ntargets = {"chat-v2" = 100}', "may not take the name of a model"),
        ('[routes.chat]\ntargets = {"chat-v3" = 100}', "unknown models: chat-v3"),
        ('[routes.chat]\ntargets = {"chat-v1" = 60, "chat-v2" = 30}', "sum to 100"),
        ("[routes.chat]\ntargets = {}", "sum to 100"),
        ('[routes.chat]\ntargets = {"chat-v1" = 100}\nweights = 1', "weights"),
        ('[routes."bad name"]\ntargets = {"chat-v1" = 100}', "invalid configuration"),
        ('[routes."team/chat"]\ntargets = {"chat-v1" = 100}', "invalid configuration"),
    ],
)
def test_a_route_the_config_cannot_use_is_a_config_error(tmp_path: Path, routes: str, says: str) -> None:
    path = tmp_path / "sb.toml"
    path.write_text(ROUTED.split("[routes.chat]")[0] + routes)
    with pytest.raises(ConfigError, match=says):
        load_settings(path, environ={})


def test_a_key_may_be_allowed_a_route(tmp_path: Path) -> None:
    key = f'[[auth.keys]]\nname = "app"\nsha256 = "{"0" * 64}"\nmodels = ["chat"]\n'
    path = tmp_path / "sb.toml"
    path.write_text(key + ROUTED)
    assert load_settings(path, environ={}).auth.keys[0].models == ["chat"]


CONFIGURED = Route(name="chat", targets=("chat-v1", "chat-v2"), weights=(90, 10))


async def test_seeding_writes_the_configured_weights_once_and_keeps_live_ones(redis: aioredis.Redis) -> None:
    assert await seed_route(redis, CONFIGURED)
    seeded = await redis.get(keys.routes_version())
    await write_weights(redis, "chat", (50, 50), CONFIGURED.targets)
    assert not await seed_route(redis, CONFIGURED)  # a restarted front door keeps the live weights
    live = route_from_fields("chat", CONFIGURED.targets, await redis.hgetall(keys.route("chat")))
    assert live is not None and live.weights == (50, 50) and live.version == 2
    assert seeded and await redis.get(keys.routes_version()) not in (None, seeded)  # front doors notice


async def test_live_weights_for_other_targets_give_way_to_the_config(redis: aioredis.Redis) -> None:
    await write_weights(redis, "chat", (100,), ("old",))
    assert await seed_route(redis, CONFIGURED)
    live = route_from_fields("chat", CONFIGURED.targets, await redis.hgetall(keys.route("chat")))
    assert live is not None and live.weights == (90, 10)


def change_the_route_as_it_is_read(
    monkeypatch: pytest.MonkeyPatch, redis_server: PrivateRedis, times: int
) -> list[int]:
    """Another client bumps the route's version right after each of the first `times` reads of its
    rollout (inside the WATCH, as a front door seeding it or the judge stepping it would); the
    number of writes made so far."""
    written = [0]
    decode = decode_state

    def read_with_a_write_beside(raw: bytes | None) -> object:
        if written[0] < times:
            written[0] += 1
            with redis.Redis.from_url(redis_server.url) as other:
                other.hincrby(keys.route("chat"), VERSION_FIELD, 1)
        return decode(raw)

    monkeypatch.setattr(routes, "decode_state", read_with_a_write_beside)
    return written


async def test_a_rollout_starts_though_the_route_changed_as_it_was_written(
    redis: aioredis.Redis, redis_server: PrivateRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    await seed_route(redis, CONFIGURED)
    written = change_the_route_as_it_is_read(monkeypatch, redis_server, times=2)
    started = await start_rollout(redis, CONFIGURED, RolloutPlan(canary="chat-v2"))
    assert written == [2] and started.phase == "warming"
    assert decode_state(await redis.hget(keys.route("chat"), ROLLOUT_FIELD)) == started  # type: ignore[misc]
    live = route_from_fields("chat", CONFIGURED.targets, await redis.hgetall(keys.route("chat")))
    assert live is not None and live.weights == (100, 0)
    with pytest.raises(RolloutConflict, match="runs"):  # a real conflict is still one
        await start_rollout(redis, CONFIGURED, RolloutPlan(canary="chat-v2"))


async def test_a_route_that_keeps_changing_is_a_conflict(
    redis: aioredis.Redis, redis_server: PrivateRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    await seed_route(redis, CONFIGURED)
    written = change_the_route_as_it_is_read(monkeypatch, redis_server, times=WATCH_ATTEMPTS)
    with pytest.raises(RolloutConflict, match="kept changing"):
        await start_rollout(redis, CONFIGURED, RolloutPlan(canary="chat-v2"))
    assert written == [WATCH_ATTEMPTS]
    assert await redis.hget(keys.route("chat"), ROLLOUT_FIELD) is None  # type: ignore[misc]
