"""Model routes at the front door, against a real Redis: splits by weight, stickiness while weights
change, weights changed through one front door's admin API applied by another, truthful answers
(`model` and headers), routes in `/v1/models`, and who may use a route.

The test plays the worker of both target models: it reads every job queued for them and answers it
at once with its own model's name as the text, so that the answer tells which model's queue it took.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest
import redis.asyncio as aioredis

from router.queue.move_waiting import move_waiting_jobs
from router.routing.routes.route_table import POLL_S
from switchboard import keys
from switchboard.api_keys import digest
from switchboard.cli import routes as route_commands
from switchboard.cli.main import parse_args
from switchboard.config import ApiKey, ModelConfig, RouteConfig, Settings
from switchboard.local.redis_server import PrivateRedis
from switchboard.tasks import cancel_and_wait
from switchboard.wire import Chunk, JobError, LoadFailure, Usage, encode, job_decoder
from tests.support.front_door_harness import (
    advertise,
    next_job,
    serving,
    settings_for,
    worker_record,
    write_chunks,
)
from tests.support.metric_samples import counter
from workers.jobs.writer import ResultWriter, inbox_of

STABLE, CANARY, ROUTE = "chat-v1", "chat-v2", "chat"
# Each caller is one HTTP request per phase (about 5 ms each on a small box); at 90/10, 4 sigma is
# ±27 callers around the canary's 50.
CALLERS = 500


def routed_settings(redis_url: str, stable: int = 90, canary: int = 10) -> Settings:
    models = [ModelConfig(name=STABLE, path="/nonexistent"), ModelConfig(name=CANARY, path="/nonexistent")]
    settings = settings_for(redis_url, models=models)
    settings.routes = {ROUTE: RouteConfig(targets={STABLE: stable, CANARY: canary})}
    return settings


@contextlib.asynccontextmanager
async def both_targets_answered(
    redis: aioredis.Redis, failing: frozenset[str] = frozenset()
) -> AsyncIterator[list[str]]:
    """Answer every job queued for either target with the name of the queue it was read from; the
    engine fails every job of a model in `failing`."""
    served: list[str] = []
    # Each answered job is deleted from its stream, as a worker's ack would free its place in the
    # queue, so reading every stream from its start finds only the jobs not answered yet.
    streams: dict[Any, Any] = {keys.job_stream(STABLE): "0", keys.job_stream(CANARY): "0"}
    done = Chunk(finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=1))
    broken = Chunk(error=JobError(code="engine_error", message="the engine died"))

    async def answer() -> None:
        while True:
            response: Any = await redis.xread(streams, block=50)
            for stream, entries in response or ():
                model = STABLE if stream.decode() == keys.job_stream(STABLE) else CANARY
                for entry_id, fields in entries:
                    job = job_decoder.decode(fields[keys.JOB_FIELD.encode()])
                    assert job.model == model
                    served.append(model)
                    # The answer names the model that served, and says whether the job came through the route.
                    text = model if job.route == ROUTE else f"direct:{model}"
                    answer = msgspec.structs.replace(done, text=text) if model not in failing else broken
                    await write_chunks(redis, job.id, answer)
                    await redis.xdel(stream, entry_id)

    task = asyncio.create_task(answer())
    try:
        yield served
    finally:
        await cancel_and_wait(task)  # a blocked XREAD can lose one cancellation (redis-py on 3.11)


def chat_body(model: str = ROUTE, **extra: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, **extra}


async def served_to(client: httpx.AsyncClient, sessions: range) -> dict[int, str]:
    """The model that served each caller (by session header), asked 32 at a time."""
    gate = asyncio.Semaphore(32)

    async def one(session: int) -> tuple[int, str]:
        async with gate:
            response = await client.post(
                "/v1/chat/completions", json=chat_body(), headers={"x-session-id": f"s{session}"}
            )
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["model"] == answer["choices"][0]["message"]["content"]  # the serving model, truly
        assert response.headers["x-switchboard-model"] == answer["model"]
        assert response.headers["x-switchboard-route"] == ROUTE
        return session, answer["model"]

    return dict(await asyncio.gather(*(one(s) for s in sessions)))


def within_four_sigma(count: int, total: int, share: float) -> bool:
    return abs(count - total * share) <= 4 * math.sqrt(total * share * (1 - share))


async def wait_for_version(client: httpx.AsyncClient, version: int, timeout_s: float = 3.0) -> float:
    """Seconds until this front door's `/admin/routes/chat` shows `version`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if (await client.get(f"/admin/routes/{ROUTE}")).json()["version"] >= version:
            return time.monotonic() - started
        await asyncio.sleep(0.02)
    raise AssertionError(f"version {version} did not arrive in {timeout_s} s")


async def test_callers_split_by_weight_stay_put_and_only_move_to_the_canary_as_it_grows(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    settings = routed_settings(redis_server.url)
    async with both_targets_answered(redis), serving(settings) as first, serving(settings) as second:
        before = await served_to(first, range(CALLERS))
        canary = sum(model == CANARY for model in before.values())
        assert within_four_sigma(canary, CALLERS, 0.10), canary

        # Changed through the first front door; the second applies it within about a second.
        changed = await first.put(
            f"/admin/routes/{ROUTE}/weights", json={"weights": {STABLE: 50, CANARY: 50}}
        )
        assert changed.status_code == 200, changed.text
        assert [t["weight"] for t in changed.json()["targets"]] == [50, 50]
        assert await wait_for_version(second, changed.json()["version"]) < 1.5

        after = await served_to(second, range(CALLERS))
    assert not [s for s in before if before[s] == CANARY and after[s] == STABLE]  # nobody moved back
    moved = sum(before[s] == STABLE and after[s] == CANARY for s in before)
    assert within_four_sigma(moved + canary, CALLERS, 0.50), moved


async def test_the_same_caller_gets_the_same_model_by_user_or_by_key_and_streams_say_which(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    settings = routed_settings(redis_server.url, stable=50, canary=50)
    async with both_targets_answered(redis), serving(settings) as client:
        for user in ("ada", "grace", "edsger", "barbara"):
            models = set()
            for _ in range(3):
                response = await client.post("/v1/chat/completions", json=chat_body(user=user, stream=True))
                assert response.status_code == 200
                events = [
                    json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")
                ]
                models |= {event["model"] for event in events}
                text = "".join(
                    event["choices"][0]["delta"].get("content") or "" for event in events if event["choices"]
                )
                assert {text} == models  # the test's worker answers with the name of the model it served
                assert response.headers["x-switchboard-model"] in models
                assert response.headers["x-switchboard-route"] == ROUTE
            assert len(models) == 1, (user, models)
        completion = await client.post(
            "/v1/completions", json={"model": ROUTE, "prompt": "Hi", "max_tokens": 1}
        )
        assert completion.json()["model"] == completion.json()["choices"][0]["text"]
        assert completion.headers["x-switchboard-model"] == completion.json()["model"]
        direct = await client.post("/v1/chat/completions", json=chat_body(STABLE))
        assert direct.json()["model"] == STABLE
        assert direct.json()["choices"][0]["message"]["content"] == f"direct:{STABLE}"
        assert direct.headers["x-switchboard-model"] == STABLE and "x-switchboard-route" not in direct.headers


async def test_weights_the_route_cannot_take_are_a_400_and_change_nothing(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    async with serving(routed_settings(redis_server.url)) as client:
        shown = (await client.get(f"/admin/routes/{ROUTE}")).json()
        assert [(t["model"], t["weight"]) for t in shown["targets"]] == [(STABLE, 90), (CANARY, 10)]
        for weights in (
            {STABLE: 60, CANARY: 30},
            {STABLE: 100},
            {STABLE: 50, CANARY: 40, "other": 10},
            {STABLE: 50.5, CANARY: 49.5},
            {STABLE: "50", CANARY: 50},
        ):
            refused = await client.put(f"/admin/routes/{ROUTE}/weights", json={"weights": weights})
            assert refused.status_code == 400, (weights, refused.text)
            assert refused.json()["error"]["type"] == "invalid_request_error"
        for body in (b"[1]", b"{", b'{"weights": 5}', b'{"weights": {}, "extra": 1}'):
            refused = await client.put(
                f"/admin/routes/{ROUTE}/weights", content=body, headers={"content-type": "application/json"}
            )
            assert refused.status_code == 400, (body, refused.text)
        wrong_type = await client.put(f"/admin/routes/{ROUTE}/weights", content=b"{}")
        assert wrong_type.status_code == 415
        unknown = await client.put("/admin/routes/nope/weights", json={"weights": {STABLE: 100}})
        assert unknown.status_code == 404 and "error" in unknown.json()
        assert (await client.get("/admin/routes/nope")).status_code == 404
        listed = (await client.get("/admin/routes")).json()["data"]
        assert [(r["name"], r["version"]) for r in listed] == [(ROUTE, shown["version"])]


async def test_routes_are_listed_beside_models_and_a_key_allowed_a_route_uses_its_targets_through_it(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    settings = routed_settings(redis_server.url)
    settings.auth.keys = [
        ApiKey(name="app", sha256=digest("sb-app"), models=[ROUTE]),
        ApiKey(name="v1-only", sha256=digest("sb-v1"), models=[STABLE]),
        ApiKey(name="ops", sha256=digest("sb-ops"), admin=True),
    ]

    def key(secret: str) -> dict[str, str]:
        return {"authorization": f"Bearer {secret}"}

    async with both_targets_answered(redis), serving(settings) as client:
        everything = (await client.get("/v1/models", headers=key("sb-ops"))).json()["data"]
        assert [(card["id"], card["owned_by"]) for card in everything] == [
            (STABLE, "switchboard"),
            (CANARY, "switchboard"),
            (ROUTE, "switchboard-route"),
        ]
        assert everything[2]["targets"] == [STABLE, CANARY]
        assert [
            card["id"] for card in (await client.get("/v1/models", headers=key("sb-app"))).json()["data"]
        ] == [ROUTE]
        assert (await client.get(f"/v1/models/{ROUTE}", headers=key("sb-app"))).json()["owned_by"] == (
            "switchboard-route"
        )
        assert (await client.get(f"/v1/models/{ROUTE}", headers=key("sb-v1"))).status_code == 403

        through_route = await client.post("/v1/chat/completions", json=chat_body(), headers=key("sb-app"))
        assert through_route.status_code == 200 and through_route.json()["model"] in (STABLE, CANARY)
        # The API key is the stickiness key when there is no session header and no user.
        again = await client.post("/v1/chat/completions", json=chat_body(), headers=key("sb-app"))
        assert again.json()["model"] == through_route.json()["model"]
        direct = await client.post("/v1/chat/completions", json=chat_body(STABLE), headers=key("sb-app"))
        assert direct.status_code == 403
        refused = await client.post("/v1/chat/completions", json=chat_body(), headers=key("sb-v1"))
        assert refused.status_code == 403 and refused.json()["error"]["type"]
        assert (await client.get("/admin/routes", headers=key("sb-app"))).status_code == 403
        assert (await client.get("/admin/routes", headers=key("sb-ops"))).status_code == 200


async def test_a_routed_request_costs_no_redis_round_trip_of_its_own(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    """The weights are read from memory: only the front door's poll (one GET each POLL_S) touches the
    routes' keys, however many requests come."""
    seen: list[str] = []

    async def watch(monitor_client: aioredis.Redis) -> None:
        async with monitor_client.monitor() as monitor:
            async for command in monitor.listen():
                if keys.route(ROUTE) in command["command"] or keys.routes_version() in command["command"]:
                    seen.append(command["command"])

    monitor_client = aioredis.Redis.from_url(redis_server.url)
    async with both_targets_answered(redis), serving(routed_settings(redis_server.url)) as client:
        # The first polls are done: one seeds the route from the config, the next reads it back.
        await asyncio.sleep(2 * POLL_S)
        watching = asyncio.create_task(watch(monitor_client))
        await asyncio.sleep(0.1)
        started = time.monotonic()
        await served_to(client, range(200))
        elapsed = time.monotonic() - started
        await cancel_and_wait(watching)
    await monitor_client.aclose()
    assert all(command == f"GET {keys.routes_version()}" for command in seen), seen
    assert len(seen) <= elapsed / POLL_S + 2


async def test_the_routes_command_lists_shows_and_sets_weights(
    redis_server: PrivateRedis, redis: aioredis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    async with serving(routed_settings(redis_server.url)) as client:
        url = str(client.base_url)

        def routes(*argv: str) -> tuple[int, str, str]:
            args = parse_args(["routes", "--url", url, *argv])
            code = route_commands.run(args, args.url, None)
            out, err = capsys.readouterr()
            return code, out, err

        code, out, _ = await asyncio.to_thread(routes, "list")
        assert code == 0 and f"{STABLE}=90  {CANARY}=10" in out and out.startswith("ROUTE")
        code, out, _ = await asyncio.to_thread(routes, "set", ROUTE, f"{CANARY}=30", f"{STABLE}=70")
        assert code == 0 and f"{STABLE}=70  {CANARY}=30" in out  # shown in the route's fixed order
        args = parse_args(["routes", "show", ROUTE, "--url", url])  # the flags also come after
        assert args.url == url and args.key is None
        code, out, _ = await asyncio.to_thread(routes, "show", ROUTE)
        assert code == 0 and f"{STABLE}=70  {CANARY}=30" in out
        code, _, err = await asyncio.to_thread(routes, "set", ROUTE, f"{STABLE}=70", f"{CANARY}=20")
        assert code == 1 and "400" in err and "sum to 100" in err
        code, _, err = await asyncio.to_thread(routes, "show", "nope")
        assert code == 1 and "404" in err
    with pytest.raises(SystemExit):
        parse_args(["routes", "set", ROUTE, "chat-v1:50"])


async def test_a_resumed_stream_keeps_the_version_its_job_was_queued_for(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    async with both_targets_answered(redis), serving(routed_settings(redis_server.url, 100, 0)) as client:
        first = await client.post("/v1/chat/completions", json=chat_body(user="ada", stream=True))
        assert first.headers["x-switchboard-model"] == STABLE
        request_id = first.headers["x-request-id"]
        moved = await client.put(f"/admin/routes/{ROUTE}/weights", json={"weights": {STABLE: 0, CANARY: 100}})
        assert moved.status_code == 200
        # The client lost its connection before any event: it counted none, and resumes from the start.
        resumed = await client.post(
            "/v1/chat/completions",
            json=chat_body(user="ada", stream=True),
            headers={"Last-Event-ID": f"{request_id}:0"},
        )
        assert resumed.status_code == 200, resumed.text
        events = [json.loads(line[6:]) for line in resumed.text.splitlines() if line.startswith("data: {")]
        assert events and {event["model"] for event in events} == {STABLE}
        assert resumed.headers["x-switchboard-model"] == STABLE
        fresh = await client.post("/v1/chat/completions", json=chat_body(user="ada"))
        assert fresh.json()["model"] == CANARY, "a new request of the same caller goes where the weights say"


async def test_a_request_its_canary_fails_before_the_first_byte_is_answered_by_the_stable_version(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    retried = counter("switchboard:fallbacks", via=ROUTE, model=CANARY, reason="engine_error")
    async with (
        both_targets_answered(redis, failing=frozenset({CANARY})) as served,
        serving(routed_settings(redis_server.url, 0, 100)) as client,
    ):
        for stream in (False, True):
            answer = await client.post("/v1/chat/completions", json=chat_body(user="ada", stream=stream))
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-switchboard-model"] == STABLE
            assert STABLE in answer.text and "engine died" not in answer.text
        assert served == [CANARY, STABLE, CANARY, STABLE]
        assert counter("switchboard:fallbacks", via=ROUTE, model=CANARY, reason="engine_error") == retried + 2
        # Named directly, the canary's failure is the client's answer: nothing to fall back to.
        direct = await client.post("/v1/chat/completions", json=chat_body(CANARY))
        assert direct.status_code == 500 and direct.json()["error"]["message"] == "the engine died"

        # A canary whose last load failed is not even queued: the stable version answers at once.
        failure = LoadFailure(
            model=CANARY, worker_id="w1", reason="no memory", failed_at=time.time(), retry_at=time.time() + 60
        )
        await redis.set(keys.load_failure(CANARY), encode(failure))
        completion = await client.post(
            "/v1/completions", json={"model": ROUTE, "prompt": "Hi", "max_tokens": 1}
        )
        assert completion.status_code == 200, completion.text
        assert completion.json()["model"] == STABLE == completion.headers["x-switchboard-model"]


async def test_refusals_after_routing_name_the_version_and_a_404_lists_the_routes(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    # A live worker that may hold neither target: the stable version is refused with a 503 at once.
    await advertise(redis, msgspec.structs.replace(worker_record("w1"), allowed=("elsewhere",)))
    async with serving(routed_settings(redis_server.url, 100, 0)) as client:
        refused = await client.post("/v1/chat/completions", json=chat_body(user="ada"))
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "no_worker_for_model"
        assert refused.headers["x-switchboard-model"] == STABLE
        assert refused.headers["x-switchboard-route"] == ROUTE
        unknown = await client.post("/v1/chat/completions", json=chat_body("chat-v3"))
        assert unknown.status_code == 404
        assert ROUTE in unknown.json()["error"]["message"] and STABLE in unknown.json()["error"]["message"]
        assert "x-switchboard-model" not in unknown.headers


async def test_a_job_moved_to_the_stable_version_while_it_waited_is_answered_under_its_name(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    """A rollback moves the canary's waiting jobs; the worker that runs one writes under the stable
    version's name (its record's model, through the real append script), and the answer says so."""
    writer = ResultWriter(redis, "w1")
    writer.start()
    async with serving(routed_settings(redis_server.url, 0, 100)) as client:
        for stream in (False, True):
            request = asyncio.create_task(
                client.post("/v1/chat/completions", json=chat_body(user="ada", stream=stream))
            )
            job = await next_job(redis, CANARY)
            assert await move_waiting_jobs(redis, CANARY, STABLE) == 1
            done = Chunk(
                text="moved", finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=1)
            )
            await writer.append(job.id, encode(done), seq=0, first=True, inbox=inbox_of(job))
            answer = await request
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-switchboard-model"] == STABLE
            assert f'"model":"{STABLE}"' in answer.text and CANARY not in answer.text
            await redis.delete(keys.job_stream(CANARY), keys.job_stream(STABLE))
    await writer.stop()
