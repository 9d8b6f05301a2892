"""Pipelines set through the admin API at real front doors, with real Redis: a pipeline created
through one front door is listed and answered through its steps by another within about a second;
what the config could not hold is a 400 in OpenAI's shape; a pipeline still named elsewhere cannot
be deleted (409); `switchboard pipelines` drives it all; and a request naming a pipeline reads none
of the pipelines' keys.

The test plays the workers: every job of every model is answered with the model's name, or failed
by its engine for a model in `failing`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
import redis.asyncio as aioredis

from router.routing.routes.route_table import POLL_S
from switchboard import keys
from switchboard.api_keys import KeyStore
from switchboard.cli import pipelines as pipeline_commands
from switchboard.cli.main import parse_args
from switchboard.config import ModelConfig, PipelineConfig, RouteConfig, Settings
from switchboard.local.redis_server import PrivateRedis
from switchboard.tasks import cancel_and_wait
from tests.support.front_door_harness import serving, settings_for
from tests.support.key_census import take_census
from tests.support.scripted_models import models_answering

BIG, SMALL, CODER = "big", "small", "coder"
MODELS = (BIG, SMALL, CODER)
# Configured: the route `chat` sends a share of its callers to the pipeline `resilient`.
ROUTE, CONFIGURED, FRESH = "chat", "resilient", "fresh"


def admin_settings(redis_url: str) -> Settings:
    settings = settings_for(redis_url, models=[ModelConfig(name=m, path="/nonexistent") for m in MODELS])
    settings.routes = {ROUTE: RouteConfig(targets={BIG: 90, CONFIGURED: 10})}
    settings.pipelines = {CONFIGURED: PipelineConfig(fallbacks=[BIG, SMALL])}
    return settings


def stored_key(redis_url: str, name: str, **rights: Any) -> str:
    """A key stored in Redis as `switchboard keys add` does; its secret."""
    with redis.Redis.from_url(redis_url) as client:
        secret, _ = KeyStore(client).add(name, **rights)
    return secret


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


async def listed(client: httpx.AsyncClient, secret: str) -> dict[str, dict[str, Any]]:
    cards = (await client.get("/v1/models", headers=bearer(secret))).json()["data"]
    return {card["id"]: card for card in cards}


async def seconds_until(check: Any, timeout_s: float = 3.0) -> float:
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < timeout_s, "the change did not arrive"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def test_a_pipeline_created_through_one_front_door_is_answered_through_its_steps_by_another(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    ops = stored_key(redis_server.url, "ops", admin=True)
    # A key that may use only the pipeline the admin API is about to create.
    app = stored_key(redis_server.url, "app", models=[FRESH])
    settings = admin_settings(redis_server.url)
    async with (
        models_answering(redis, MODELS, failing=frozenset({SMALL})),
        serving(settings) as first,
        serving(settings) as second,
        openai.AsyncOpenAI(base_url=f"{second.base_url}/v1", api_key=app, max_retries=0) as sdk,
    ):
        with pytest.raises(openai.NotFoundError):
            await sdk.chat.completions.create(model=FRESH, messages=[{"role": "user", "content": "Hi"}])

        put = await first.put(
            f"/admin/pipelines/{FRESH}", json={"fallbacks": [SMALL, BIG]}, headers=bearer(ops)
        )
        assert put.status_code == 200, put.text
        assert put.json() == {
            "name": FRESH,
            "shape": "fallbacks",
            "steps": [SMALL, BIG],
            "source": "admin",
            "definition": {"fallbacks": [SMALL, BIG]},
        }

        async def second_lists_it() -> bool:
            return FRESH in await listed(second, app)

        assert await seconds_until(second_lists_it) < 2 * POLL_S + 0.5
        card = (await listed(second, app))[FRESH]
        assert (card["owned_by"], card["shape"], card["steps"]) == (
            "switchboard-pipeline",
            "fallbacks",
            [SMALL, BIG],
        )
        assert list(await listed(second, app)) == [FRESH]  # the key sees nothing else

        # Answered through its steps: SMALL's engine fails before the first byte, BIG answers.
        for stream in (False, True):
            raw = await sdk.chat.completions.with_raw_response.create(
                model=FRESH, messages=[{"role": "user", "content": "Hi"}], stream=stream
            )
            assert (
                raw.headers["x-switchboard-pipeline"] == FRESH and raw.headers["x-switchboard-model"] == BIG
            )
            answer = raw.parse()
            if stream:
                chunks = [chunk async for chunk in answer]  # type: ignore[union-attr]
                assert {chunk.model for chunk in chunks} == {BIG}
                assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == BIG
            else:
                assert answer.model == BIG and answer.choices[0].message.content == BIG  # type: ignore[union-attr]
        with pytest.raises(openai.PermissionDeniedError):  # its steps only through the pipeline
            await sdk.chat.completions.create(model=BIG, messages=[{"role": "user", "content": "Hi"}])

        # Deleted through the second front door: the first forgets it as quickly.
        gone = await second.delete(f"/admin/pipelines/{FRESH}", headers=bearer(ops))
        assert gone.status_code == 200 and gone.json() == {"id": FRESH, "object": "pipeline", "deleted": True}

        async def first_forgot_it() -> bool:
            return FRESH not in await listed(first, ops)

        assert await seconds_until(first_forgot_it) < 2 * POLL_S + 0.5


async def test_what_the_config_could_not_hold_is_a_400_and_a_pipeline_still_named_a_409(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    ops = stored_key(redis_server.url, "ops", admin=True)
    user = stored_key(redis_server.url, "user")
    async with serving(admin_settings(redis_server.url)) as client:

        async def put(name: str, body: Any, **extra: Any) -> httpx.Response:
            return await client.put(
                f"/admin/pipelines/{name}", json=body, **{"headers": bearer(ops), **extra}
            )

        def error(response: httpx.Response, status: int, code: str | None = None) -> str:
            assert response.status_code == status, response.text
            detail = response.json()["error"]
            assert detail["type"] == "invalid_request_error" and detail["code"] == (code or detail["code"])
            return str(detail["message"])

        # The route `chat` sends callers to `resilient`: `resilient` may not send them back.
        loop = error(await put(CONFIGURED, {"fallbacks": [ROUTE, SMALL]}), 400, "invalid_pipeline")
        assert "chat -> resilient -> chat" in loop or "resilient -> chat -> resilient" in loop
        assert "may not take the name of a model" in error(await put(BIG, {"fallbacks": [SMALL, CODER]}), 400)
        assert "may not take the name of a route" in error(
            await put(ROUTE, {"fallbacks": [SMALL, CODER]}), 400
        )
        assert "'ghost' is no model" in error(await put(FRESH, {"fallbacks": [SMALL, "ghost"]}), 400)
        assert "exactly one of" in error(await put(FRESH, {}), 400)
        assert "`shape`" in error(await put(FRESH, {"fallbacks": [SMALL, BIG], "shape": "x"}), 400)
        router_without_default = {"router": {"model": SMALL, "targets": {}}}
        assert "router.default" in error(await put(FRESH, router_without_default), 400)
        assert "not valid JSON" in error(
            await put(
                FRESH, None, content=b"{oops", headers={**bearer(ops), "content-type": "application/json"}
            ),
            400,
        )
        assert error(await put("bad%20name", {"fallbacks": [SMALL, BIG]}), 400).startswith("Pipeline name")
        form = await client.put(f"/admin/pipelines/{FRESH}", data={"fallbacks": "x"}, headers=bearer(ops))
        assert form.status_code == 415
        assert await redis.exists(keys.pipelines()) == 0  # nothing was stored

        # A pipeline another pipeline names cannot go; once that one no longer does, it can.
        assert (await put(FRESH, {"fallbacks": [SMALL, CODER]})).status_code == 200
        assert (await put(CONFIGURED, {"fallbacks": [FRESH, BIG]})).status_code == 200
        in_use = error(
            await client.delete(f"/admin/pipelines/{FRESH}", headers=bearer(ops)), 409, "pipeline_conflict"
        )
        assert "named by pipeline 'resilient'" in in_use
        # A fallback step is a pipeline of fallbacks: the one named cannot become a cascade.
        cascade = {"cascade": {"draft": SMALL, "strong": BIG}}
        assert "cascade pipeline" in error(await put(FRESH, cascade), 400)
        back = await client.delete(f"/admin/pipelines/{CONFIGURED}", headers=bearer(ops))
        assert back.json()["source"] == "config" and back.json()["steps"] == [BIG, SMALL]
        assert (await client.delete(f"/admin/pipelines/{FRESH}", headers=bearer(ops))).status_code == 200
        assert "No pipeline `fresh`" in error(
            await client.delete(f"/admin/pipelines/{FRESH}", headers=bearer(ops)), 404
        )

        # Admin only, as every /admin endpoint.
        for method in ("GET", "PUT", "DELETE"):
            denied = await client.request(
                method,
                f"/admin/pipelines/{CONFIGURED}",
                json={"fallbacks": [SMALL, BIG]},
                headers=bearer(user),
            )
            assert denied.status_code == 403, (method, denied.text)
        listing = (await client.get("/admin/pipelines", headers=bearer(ops))).json()
        assert [(p["name"], p["source"]) for p in listing["data"]] == [(CONFIGURED, "config")]


async def test_the_pipelines_command_lists_shows_sets_and_deletes(
    redis_server: PrivateRedis, redis: aioredis.Redis, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = tmp_path / "cascade.toml"
    toml.write_text(f'[pipelines.{FRESH}.cascade]\ndraft = "{SMALL}"\nstrong = "{BIG}"\nhold_s = 3\n')
    router = tmp_path / "router.json"
    router.write_text(
        json.dumps(
            {
                "router": {
                    "model": SMALL,
                    "default": "chat",
                    "targets": {
                        "code": {"model": CODER, "description": "programming"},
                        "chat": {"model": FRESH, "description": "everything else"},
                    },
                }
            }
        )
    )
    async with serving(admin_settings(redis_server.url)) as client:
        url = str(client.base_url)

        def pipelines(*argv: str) -> tuple[int, str, str]:
            args = parse_args(["pipelines", "--url", url, *argv])
            code = pipeline_commands.run(args, args.url, None)
            out, err = capsys.readouterr()
            return code, out, err

        code, out, _ = await asyncio.to_thread(pipelines, "set", FRESH, "--file", str(toml))
        assert code == 0 and re.split(r"\s{2,}", out.splitlines()[1]) == [
            FRESH,
            "cascade",
            f"{SMALL}, else {BIG}",
            "admin",
        ]
        code, out, _ = await asyncio.to_thread(pipelines, "set", CONFIGURED, "--file", str(router))
        assert code == 0, out
        code, out, _ = await asyncio.to_thread(pipelines, "list")
        assert [re.split(r"\s{2,}", line) for line in out.splitlines()] == [
            ["PIPELINE", "SHAPE", "STEPS", "SOURCE"],
            [CONFIGURED, "router", f"{SMALL} chooses: {CODER} | {FRESH}", "admin"],
            [FRESH, "cascade", f"{SMALL}, else {BIG}", "admin"],
        ]
        code, out, _ = await asyncio.to_thread(pipelines, "show", FRESH)
        definition = json.loads(out[out.index("{") :])
        assert code == 0 and definition == {"cascade": {**definition["cascade"], "draft": SMALL, "hold_s": 3}}
        code, _, err = await asyncio.to_thread(pipelines, "delete", FRESH)
        assert code == 1 and "409" in err and "named by pipeline 'resilient'" in err
        code, out, _ = await asyncio.to_thread(pipelines, "delete", CONFIGURED)
        assert code == 0 and f"{BIG} -> {SMALL}  config" in out
        code, out, _ = await asyncio.to_thread(pipelines, "delete", FRESH)
        assert code == 0 and out == f"pipeline {FRESH} deleted\n"
        code, _, err = await asyncio.to_thread(pipelines, "set", FRESH, "--file", str(tmp_path / "none.toml"))
        assert code == 2 and "cannot read the pipeline" in err
        toml.write_text(f'[pipelines.{FRESH}]\nfallbacks = ["{SMALL}"]\n')
        code, _, err = await asyncio.to_thread(pipelines, "set", FRESH, "--file", str(toml))
        assert code == 1 and "400" in err and "at least two steps" in err
        assert await redis.hlen(keys.pipelines()) == 0  # type: ignore[misc]


async def test_a_request_naming_a_pipeline_reads_none_of_the_pipelines_keys(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    """Pipelines are looked up in memory: only the front door's poll (one GET each POLL_S) touches
    the pipelines' keys, however many requests name one."""
    seen: list[str] = []

    async def watch(monitor_client: aioredis.Redis) -> None:
        async with monitor_client.monitor() as monitor:
            async for command in monitor.listen():
                if keys.pipelines() in command["command"]:
                    seen.append(command["command"])

    monitor_client = aioredis.Redis.from_url(redis_server.url)
    async with models_answering(redis, MODELS), serving(admin_settings(redis_server.url)) as client:
        put = await client.put(f"/admin/pipelines/{FRESH}", json={"fallbacks": [SMALL, BIG]})
        assert put.status_code == 200
        watching = asyncio.create_task(watch(monitor_client))
        await asyncio.sleep(0.1)
        started = time.monotonic()
        for name in [FRESH, CONFIGURED] * 25:
            body = {"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        elapsed = time.monotonic() - started
        await cancel_and_wait(watching)
    await monitor_client.aclose()
    assert all(command == f"GET {keys.pipelines_version()}" for command in seen), seen
    assert len(seen) <= elapsed / POLL_S + 2
    # The definitions set through the admin API are operator data that lives on, like the routes'.
    census = await asyncio.to_thread(take_census, redis_server.url)
    assert census.families["pipelines"] == census.families["pipelines version"] == 1, census
    assert not census.strays, census
