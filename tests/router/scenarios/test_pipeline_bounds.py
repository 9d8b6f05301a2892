"""The bounds on how far pipelines nest and expand, at a real front door with real Redis: a chain of
pipelines in pairs, each naming both of the level below, is set through the admin API level by level
until a level would expand past the bound: that one is a 400 in milliseconds that states the bound,
and the deepest level allowed is answered through its steps at once.

Before the bound, every level was accepted, and a request naming the twenty-second level held the
front door's event loop for 5.4 s (the 2^22 paths through the pairs, walked once each).
"""

from __future__ import annotations

import time

import httpx
import openai
import redis.asyncio as aioredis

from switchboard.config import ModelConfig
from switchboard.config.pipeline_checks import MAX_EXPANSION
from switchboard.local.redis_server import PrivateRedis
from tests.router.scenarios.test_pipeline_admin import bearer, stored_key
from tests.support.front_door_harness import serving, settings_for
from tests.support.scripted_models import models_answering

BIG, SMALL = "big", "small"


def pair(level: int) -> dict[str, dict[str, list[str]]]:
    """The definitions of level `level`'s two pipelines (level 0 names the models)."""
    if level == 0:
        return {"a0": {"fallbacks": [BIG, SMALL]}, "b0": {"fallbacks": [SMALL, BIG]}}
    below = [f"a{level - 1}", f"b{level - 1}"]
    return {f"a{level}": {"fallbacks": below}, f"b{level}": {"fallbacks": below[::-1]}}


async def test_a_chain_of_pipeline_pairs_is_refused_at_the_level_past_the_bound_in_milliseconds(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    ops = stored_key(redis_server.url, "ops", admin=True)
    settings = settings_for(
        redis_server.url, models=[ModelConfig(name=m, path="/nonexistent") for m in (BIG, SMALL)]
    )
    async with (
        models_answering(redis, (BIG, SMALL), failing=frozenset({BIG})),
        serving(settings) as client,
        openai.AsyncOpenAI(base_url=f"{client.base_url}/v1", api_key=ops, max_retries=0) as sdk,
    ):
        refused: tuple[int, httpx.Response, float] | None = None
        for level in range(30):
            for name, definition in pair(level).items():
                started = time.perf_counter()
                answer = await client.put(f"/admin/pipelines/{name}", json=definition, headers=bearer(ops))
                took_s = time.perf_counter() - started
                if answer.status_code != 200:
                    refused = (level, answer, took_s)
                    break
            if refused is not None:
                break
        assert refused is not None, "every level of the chain was accepted"
        level, answer, took_s = refused
        # Level n expands to 2^(n+2) - 1 names: 255 at level 6, 511 at level 7.
        assert level == 7 and answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "invalid_pipeline"
        assert f"at most {MAX_EXPANSION} may be reached" in error["message"]
        assert took_s < 0.25, f"the refusal took {took_s:.3f} s"

        # The deepest level allowed is answered through its steps at once (BIG fails, SMALL answers).
        started = time.perf_counter()
        raw = await sdk.chat.completions.with_raw_response.create(
            model="a6", messages=[{"role": "user", "content": "Hi"}]
        )
        assert raw.headers["x-switchboard-model"] == SMALL and raw.parse().model == SMALL
        assert time.perf_counter() - started < 2.0
