"""Progressive rollouts of a route's canary at the front door, against a real Redis: a healthy canary
promoted step by step while two front doors share the rollout (one judges, both apply its weights)
and the judging one stops mid-rollout (the other takes over and finishes); a failing canary rolled
back with its reason in `/admin/routes`, a WARNING and the metric; the operator's API and commands.

The test plays the workers of both targets (a live worker record holding both warm) and answers each
job after a scripted delay, or with an engine error for a share of the canary's jobs. Steps are
short (0.5 s, 5 requests) and the judge ticks every 0.1 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import msgspec
import pytest
import redis.asyncio as aioredis

from router.routing.rollouts import judge
from router.telemetry import rollout_observations as observations
from switchboard import keys
from switchboard.cli import routes as route_commands
from switchboard.cli.main import parse_args
from switchboard.local.redis_server import PrivateRedis
from switchboard.tasks import cancel_and_wait
from switchboard.wire import Chunk, JobError, SlotStatus, Usage, job_decoder
from tests.router.scenarios.test_routes import CANARY, ROUTE, STABLE, routed_settings
from tests.support.front_door_harness import advertise, serving, worker_record, write_chunks
from tests.support.waits import eventually

# What the scripted worker does with the nth job of a model: (seconds before answering, fail it).
Behaviour = Callable[[str, int], tuple[float, bool]]

FAST: Behaviour = lambda model, n: (0.1, False)  # noqa: E731  (scheduling noise is small beside it)
# A canary that fails 3 jobs in 10 with an engine error, spread so that any 5 in a row hold one or
# two: above stable's 0 % + 5 points, below the rate that rolls back at once (50 %).
FAILING_CANARY: Behaviour = lambda model, n: (0.02, model == CANARY and n % 10 in (3, 6, 9))  # noqa: E731

# Short steps; a healthy canary's latency is stable's, so its ratios are held only to what a loaded
# machine's noise could never reach.
# Each request comes from a session of its own (`traffic`): with keys off, a caller of its own.
QUICK_PLAN = {
    "interval_s": 0.5,
    "min_requests": 5,
    "min_callers": 5,
    "max_ttft_p95_ratio": 5.0,
    "max_itl_p95_ratio": 5.0,
}
# For a canary as fast as stable (the same scripted engine) whose every check must pass: a p95 of
# five requests is one request, which a loaded machine has made ten times stable's.
HEALTHY_PLAN = {**QUICK_PLAN, "max_ttft_p95_ratio": 50.0, "max_itl_p95_ratio": 50.0}


@pytest.fixture(autouse=True)
def quick_judge(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(judge, "TICK_S", 0.1)
    monkeypatch.setattr(judge, "LEASE_MS", 1000)
    monkeypatch.setattr(observations, "FLUSH_S", 0.1)


@contextlib.asynccontextmanager
async def scripted_workers(
    redis: aioredis.Redis, behaviour: Behaviour, holding: set[str] | None = None
) -> AsyncIterator[None]:
    """A live worker holding both targets warm (or those in `holding`, which the test may change:
    the worker's record says so from its next beat), answering every job as `behaviour` says."""
    streams: dict[Any, Any] = {keys.job_stream(STABLE): "0", keys.job_stream(CANARY): "0"}
    holding = {STABLE, CANARY} if holding is None else holding
    served = {STABLE: 0, CANARY: 0}
    answering: set[asyncio.Task[None]] = set()

    async def answer(job_id: str, model: str, delay_s: float, fail: bool) -> None:
        await asyncio.sleep(delay_s)
        if fail:
            chunk = Chunk(error=JobError(code="engine_error", message="the canary broke"))
        else:
            chunk = Chunk(text=model, finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=1))
        await write_chunks(redis, job_id, chunk)

    async def take() -> None:
        beat, held = 0.0, 0
        while True:
            if time.monotonic() - beat > 1.0 or len(holding) != held:
                slots = [SlotStatus(model=model, state="warm") for model in sorted(holding)]
                record = msgspec.structs.replace(worker_record("w1", *slots), allowed=tuple(sorted(holding)))
                await advertise(redis, record)
                beat, held = time.monotonic(), len(holding)
            response: Any = await redis.xread(streams, block=50)
            for stream, entries in response or ():
                model = STABLE if stream.decode() == keys.job_stream(STABLE) else CANARY
                for entry_id, fields in entries:
                    job = job_decoder.decode(fields[keys.JOB_FIELD.encode()])
                    delay_s, fail = behaviour(model, served[model])
                    served[model] += 1
                    task = asyncio.create_task(answer(job.id, model, delay_s, fail))
                    answering.add(task)
                    task.add_done_callback(answering.discard)
                    await redis.xdel(stream, entry_id)

    task = asyncio.create_task(take())
    try:
        yield
    finally:
        await cancel_and_wait(task)
        for pending in list(answering):
            await cancel_and_wait(pending)


@contextlib.asynccontextmanager
async def traffic(*clients: httpx.AsyncClient, stream: bool = False) -> AsyncIterator[list[int]]:
    """Requests to the route from new callers, 8 at a time through each client, until the block ends;
    the statuses answered."""
    statuses: list[int] = []
    body = {
        "model": ROUTE,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1,
        "stream": stream,
    }

    async def caller(client: httpx.AsyncClient) -> None:
        while not client.is_closed:  # a front door stopped mid-test closes its client
            with contextlib.suppress(httpx.HTTPError, RuntimeError):
                response = await client.post(
                    "/v1/chat/completions", json=body, headers={"x-session-id": uuid.uuid4().hex}
                )
                statuses.append(response.status_code)

    tasks = [asyncio.create_task(caller(client)) for client in clients for _ in range(8)]
    try:
        yield statuses
    finally:
        for task in tasks:
            await cancel_and_wait(task)


async def rollout_of(client: httpx.AsyncClient) -> dict[str, Any]:
    rollout: dict[str, Any] = (await client.get(f"/admin/routes/{ROUTE}")).json()["rollout"]
    return rollout


async def until(
    client: httpx.AsyncClient, done: Callable[[dict[str, Any]], bool], timeout_s: float
) -> dict[str, Any]:
    """The route's rollout once `done` holds for it (as `client`'s front door shows it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rollout = await rollout_of(client)
        if done(rollout):
            return dict(rollout)
        await asyncio.sleep(0.05)
    raise AssertionError(f"not reached in {timeout_s} s: {await rollout_of(client)}")


def weights(route: dict[str, Any]) -> list[int]:
    return [target["weight"] for target in route["targets"]]


async def test_a_healthy_canary_is_promoted_step_by_step_by_one_front_door_and_another_takes_over(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    settings = routed_settings(redis_server.url, stable=100, canary=0)
    async with contextlib.AsyncExitStack() as first_door, scripted_workers(redis, FAST):
        first = await first_door.enter_async_context(serving(settings))
        started = await first.post(f"/admin/routes/{ROUTE}/rollout", json={"canary": CANARY, **HEALTHY_PLAN})
        assert started.status_code == 201, started.text
        assert started.json()["rollout"]["phase"] == "warming" and weights(started.json()) == [100, 0]
        # The first front door judges (it alone runs); the second one only applies the weights.
        await until(first, lambda r: r["phase"] == "stepping", 5)
        judging = await redis.get(keys.rollout_lease(ROUTE))
        async with serving(settings) as second, traffic(first, second) as statuses:
            at_ten = await until(second, lambda r: r["canary_weight"] == 10, 5)
            assert at_ten["step"] == 1
            shown = (await second.get(f"/admin/routes/{ROUTE}")).json()
            assert weights(shown) == [90, 10]
            at_fifty = await until(second, lambda r: r["canary_weight"] == 50, 10)
            assert at_fifty["last_check"]["passed"] and at_fifty["last_check"]["canary"]["requests"] >= 5
            assert await redis.get(keys.rollout_lease(ROUTE)) == judging
            # The judging front door stops mid-rollout; the second takes its lease over once it
            # expires, and goes on from the state in Redis.
            await first_door.aclose()
            promoted = await until(second, lambda r: r["phase"] == "promoted", 15)
            assert await redis.get(keys.rollout_lease(ROUTE)) not in (None, judging)
            assert weights((await second.get(f"/admin/routes/{ROUTE}")).json()) == [0, 100]
    assert [e["event"] for e in promoted["events"]] == ["started", "step", "step", "step", "promoted"]
    assert [e["detail"] for e in promoted["events"][1:4]] == ["10 %", "50 %", "100 %"]
    assert promoted["checks_failed"] == 0 and promoted["reason"] is None
    assert statuses and set(statuses) <= {200}  # a stopped front door's callers saw connection errors only


async def test_a_failing_canary_is_rolled_back_with_its_reason_a_warning_and_the_metric(
    redis_server: PrivateRedis, redis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    settings = routed_settings(redis_server.url, stable=100, canary=0)
    caplog.set_level(logging.WARNING, logger=judge.__name__)
    plan = {"canary": CANARY, **QUICK_PLAN, "steps": [50, 100]}
    async with scripted_workers(redis, FAILING_CANARY), serving(settings) as client:
        assert (await client.post(f"/admin/routes/{ROUTE}/rollout", json=plan)).status_code == 201
        async with traffic(client) as statuses:
            ended = await until(client, lambda r: r["phase"] == "rolled_back", 10)
        assert set(statuses) == {200}  # the canary's failures before the first byte were retried on stable
        route = (await client.get(f"/admin/routes/{ROUTE}")).json()
        canary_weight = 'switchboard:route_weight{model="chat-v2",route="chat"} 0.0'

        async def reported() -> bool:  # each front door reports the weights it last read (0.5 s)
            return canary_weight in (await client.get("/metrics")).text

        await eventually(reported, 3)
        metrics = (await client.get("/metrics")).text
    assert weights(route) == [100, 0]
    assert ended["checks_failed"] == 2 and ended["canary_weight"] == 0
    assert (
        ended["reason"].startswith("failure rate ")
        and "vs stable's 0.0 % (limit +5 points)" in ended["reason"]
    )
    assert ended["last_check"]["canary"]["failures"] > 0 and not ended["last_check"]["passed"]
    assert [e["event"] for e in ended["events"]] == ["started", "step", "check_failed", "rolled_back"]
    assert 'switchboard:route_rollout_events_total{event="rolled_back",route="chat"}' in metrics
    [warning] = [r for r in caplog.records if r.getMessage().startswith("rollout rolled back")]
    assert warning.levelno == logging.WARNING and ended["reason"] in warning.getMessage()
    assert vars(warning)["route"] == ROUTE and vars(warning)["canary"] == CANARY


async def test_a_canary_no_live_worker_may_hold_any_more_is_rolled_back_and_its_callers_served(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    # Its refusals (503 before any job exists, retried on stable) count as the canary's failures:
    # without them its windows would stay empty, and the rollout would wait at 50 % for ever.
    settings = routed_settings(redis_server.url, stable=100, canary=0)
    # A step long enough for the front door to see the canary's worker gone (its copy of the worker
    # records is at most a second old) well before the step's check.
    plan = {"canary": CANARY, **QUICK_PLAN, "steps": [50, 100], "interval_s": 2.5}
    holding = {STABLE, CANARY}
    async with scripted_workers(redis, FAST, holding), serving(settings) as client:
        assert (await client.post(f"/admin/routes/{ROUTE}/rollout", json=plan)).status_code == 201
        await until(client, lambda r: r["phase"] == "stepping", 5)
        holding.discard(CANARY)  # the workers that held the canary are gone
        async with traffic(client) as statuses:
            ended = await until(client, lambda r: r["phase"] == "rolled_back", 15)
    assert set(statuses) == {200}, "every caller placed on the canary was answered by stable"
    # Judged on its failure rate (the window may hold requests it served before its workers went).
    assert ended["last_check"]["canary"]["failures"] >= 5
    assert ended["reason"].startswith("failure rate ")


async def test_a_slow_canary_is_rolled_back_for_its_time_to_first_token(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    # 40 times stable's time to first token, judged at the default limit (1.5x). Stable's p95 over a
    # window of 20-odd requests is about its slowest one: at 0.8 s (16 times) one stable request held
    # 0.6 s by a loaded machine hid the canary (a full run on 2 cores promoted it); now that would
    # take 1.3 s.
    slow: Behaviour = lambda model, n: (2.0 if model == CANARY else 0.05, False)  # noqa: E731
    plan = {"canary": CANARY, **QUICK_PLAN, "steps": [50, 100], "failed_checks_to_roll_back": 1}
    del plan["max_ttft_p95_ratio"]
    async with scripted_workers(redis, slow), serving(routed_settings(redis_server.url, 100, 0)) as client:
        assert (await client.post(f"/admin/routes/{ROUTE}/rollout", json=plan)).status_code == 201
        async with traffic(client) as statuses:
            ended = await until(client, lambda r: r["phase"] == "rolled_back", 20)
    assert ended["reason"].startswith("TTFT p95 ") and ended["reason"].endswith("× stable's (limit 1.5×)")
    assert set(statuses) == {200}  # slow, not failing


async def test_a_canary_that_never_answers_is_rolled_back_as_its_streams_time_out(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    """Streams whose headers went before their deadline passed end with an error event, not a status:
    their deadline counts them as the canary's failures."""
    stuck: Behaviour = lambda model, n: (3600.0 if model == CANARY else 0.01, False)  # noqa: E731
    settings = routed_settings(redis_server.url, 100, 0)
    settings.router.request_timeout_s = 1.0
    settings.router.first_byte_budget_s = 0.2
    plan = {"canary": CANARY, **QUICK_PLAN, "steps": [50, 100]}
    async with scripted_workers(redis, stuck), serving(settings) as client:
        assert (await client.post(f"/admin/routes/{ROUTE}/rollout", json=plan)).status_code == 201
        async with traffic(client, stream=True):
            ended = await until(client, lambda r: r["phase"] == "rolled_back", 10)
    assert ended["reason"].startswith("failure rate 100.0 %") and ended["checks_failed"] == 1


async def test_the_operator_starts_shows_and_aborts_a_rollout_and_bad_plans_are_400s(
    redis_server: PrivateRedis, redis: aioredis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = routed_settings(redis_server.url, stable=100, canary=0)
    async with serving(settings) as client:
        path = f"/admin/routes/{ROUTE}/rollout"
        for body in (
            {"canary": "nope"},
            {"canary": STABLE},
            {"canary": CANARY, "steps": [50, 10, 100]},
            {"canary": CANARY, "steps": [10, 50]},
            {"canary": CANARY, "interval_s": -1},
            {"canary": CANARY, "bogus": 1},
            {"steps": [10, 100]},
        ):
            refused = await client.post(path, json=body)
            assert refused.status_code == 400, (body, refused.text)
            assert refused.json()["error"]["type"] == "invalid_request_error"
        assert (await client.post("/admin/routes/nope/rollout", json={"canary": CANARY})).status_code == 404
        assert (await client.delete(path)).status_code == 409  # none runs

        url = str(client.base_url)

        def routes(*argv: str) -> tuple[int, str, str]:
            args = parse_args(["routes", *argv, "--url", url])
            code = route_commands.run(args, args.url, None)
            out, err = capsys.readouterr()
            return code, out, err

        # No live worker holds the canary: it stays warming (the load was asked for).
        code, out, _ = await asyncio.to_thread(
            routes, "rollout", ROUTE, "--canary", CANARY, "--steps", "20,100", "--interval", "2m"
        )
        assert code == 0 and "warming" in out and f"{STABLE}=100  {CANARY}=0" in out
        shown = await rollout_of(client)
        assert shown["plan"]["steps"] == [20, 100] and shown["plan"]["interval_s"] == 120

        async def load_asked() -> bool:  # the judge asks for the canary's load at its next tick
            return await redis.get(keys.desired_state(CANARY)) is not None

        await eventually(load_asked, 2)
        again = await client.post(path, json={"canary": CANARY})
        assert again.status_code == 409 and again.json()["error"]["code"] == "rollout_conflict"
        manual = await client.put(
            f"/admin/routes/{ROUTE}/weights", json={"weights": {STABLE: 50, CANARY: 50}}
        )
        assert manual.status_code == 409
        code, out, _ = await asyncio.to_thread(routes, "abort", ROUTE)
        assert code == 0 and "aborted" in out and "aborted by operator" in out
        assert (await rollout_of(client))["phase"] == "aborted"
        code, out, _ = await asyncio.to_thread(routes, "list")
        assert code == 0 and f"{CANARY} aborted" in out
        code, _, err = await asyncio.to_thread(routes, "abort", ROUTE)
        assert code == 1 and "409" in err
