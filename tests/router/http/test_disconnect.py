"""A client that leaves ends its job at once: a cancel mark, and its slots back for the next request."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest
import redis.asyncio as aioredis
from litestar.types import Message, Receive, Scope, Send

from router.http.disconnect import cancel_on_disconnect
from switchboard import api_keys, keys
from switchboard.config import ApiKey
from switchboard.local.redis_server import PrivateRedis
from switchboard.metrics import REGISTRY
from tests.support.front_door_harness import BODY, answer_ok, next_job, serving, settings_for

SECRET = api_keys.new_secret()
HEADERS = {"Authorization": f"Bearer {SECRET}"}


async def settled(redis: aioredis.Redis, job_id: str) -> bool:
    """Whether the job got its cancel mark and every slot was given back, within a few seconds."""
    for _ in range(100):
        marked = await redis.exists(keys.cancel_mark(job_id))
        if (
            marked
            and not await redis.zcard(keys.in_flight())
            and not await redis.zcard(keys.key_in_flight(api_keys.digest(SECRET)))
        ):
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_leaves_frees_its_parallel_slot_at_once(
    redis: aioredis.Redis, redis_server: PrivateRedis, stream: bool
) -> None:
    # The deadline is far: only the disconnect can end the job in time.
    settings = settings_for(redis_server.url, timeout_s=120, first_byte_budget_s=0.1)
    settings.auth.keys = [ApiKey(name="one", sha256=api_keys.digest(SECRET), max_parallel=1)]
    async with serving(settings) as client:

        async def leave_early() -> None:
            if not stream:
                await client.post("/v1/chat/completions", json=BODY, headers=HEADERS)
                return
            request = {**BODY, "stream": True}
            async with client.stream(
                "POST", "/v1/chat/completions", json=request, headers=HEADERS
            ) as response:
                async for _ in response.aiter_lines():
                    await asyncio.sleep(3600)  # headers came (the budget passed): hang on

        leaving = asyncio.create_task(leave_early())
        job = await next_job(redis)
        await asyncio.sleep(0.3)  # past the first-byte budget: a stream's headers are out
        busy = await client.post("/v1/chat/completions", json=BODY, headers=HEADERS)
        assert busy.status_code == 429
        leaving.cancel()
        await asyncio.gather(leaving, return_exceptions=True)
        assert await settled(redis, job.id)
        # The slot is free: the next request is admitted and answered.
        await redis.delete(keys.job_stream(job.model))  # the cancelled job, which no worker took
        again = asyncio.create_task(client.post("/v1/chat/completions", json=BODY, headers=HEADERS))
        answered = await next_job(redis)
        await answer_ok(redis, answered.id)
        assert (await again).status_code == 200


async def test_a_response_sent_in_full_is_not_disturbed(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(settings_for(redis_server.url)) as client:
        request = asyncio.create_task(client.post("/v1/chat/completions", json=BODY))
        job = await next_job(redis)
        await answer_ok(redis, job.id)
        response = await request
    assert response.status_code == 200
    assert not await redis.exists(keys.cancel_mark(job.id))
    assert not await redis.zcard(keys.in_flight())


def requests_counted(model: str, status: int) -> float:
    return (
        REGISTRY.get_sample_value(
            "switchboard:requests_total", {"model": model, "route": "", "status": str(status)}
        )
        or 0.0
    )


async def test_a_client_that_abandons_its_upload_is_a_499_not_a_500(redis_server: PrivateRedis) -> None:
    async with serving(settings_for(redis_server.url)) as client:
        before = {status: requests_counted("", status) for status in (499, 500)}
        _, writer = await asyncio.open_connection(client.base_url.host, client.base_url.port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"model": '
        )
        await writer.drain()
        await asyncio.sleep(0.1)  # the handler is reading the body
        writer.close()
        assert await eventually(lambda: requests_counted("", 499) == before[499] + 1)
        assert requests_counted("", 500) == before[500]


async def test_a_client_that_leaves_mid_stream_is_a_499(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(settings_for(redis_server.url, first_byte_budget_s=0.1)) as client:
        before = requests_counted(BODY["model"], 499)

        async def leave_mid_stream() -> None:
            async with client.stream(
                "POST", "/v1/chat/completions", json={**BODY, "stream": True}
            ) as response:
                async for _ in response.aiter_lines():
                    await asyncio.sleep(3600)

        leaving = asyncio.create_task(leave_mid_stream())
        await next_job(redis)
        await asyncio.sleep(0.3)  # past the first-byte budget: the stream's headers are out
        leaving.cancel()
        await asyncio.gather(leaving, return_exceptions=True)
        assert await eventually(lambda: requests_counted(BODY["model"], 499) == before + 1)


async def test_a_client_that_closes_on_done_got_its_answer_and_is_a_200(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    """The openai SDK closes a stream as soon as it reads `[DONE]`, before the server's closing empty
    body: that client had the whole answer, so it is counted a 200, not a 499."""
    async with serving(settings_for(redis_server.url)) as client:
        before = {status: requests_counted(BODY["model"], status) for status in (200, 499)}
        reader, writer = await asyncio.open_connection(client.base_url.host, client.base_url.port)
        body = json.dumps({**BODY, "stream": True}).encode()
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        await answer_ok(redis, (await next_job(redis)).id)
        received = b""
        async with asyncio.timeout(10):
            while b"data: [DONE]" not in received:
                received += await reader.read(65536)
        writer.close()  # at once, as the SDK does
        assert await eventually(lambda: requests_counted(BODY["model"], 200) == before[200] + 1)
        assert requests_counted(BODY["model"], 499) == before[499]


async def eventually(check: Callable[[], bool], timeout_s: float = 3.0) -> bool:
    """Whether `check` holds within `timeout_s` (the request is counted once its handler has ended)."""
    for _ in range(int(timeout_s / 0.02)):
        if check():
            return True
        await asyncio.sleep(0.02)
    return check()


async def test_the_app_runs_in_the_servers_own_task_which_a_disconnect_leaves_going_on() -> None:
    body_read = asyncio.Event()
    client_gone = asyncio.Event()
    ran_in: list[asyncio.Task[object] | None] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        ran_in.append(asyncio.current_task())
        await receive()
        await asyncio.sleep(30)  # a job that would run to its deadline

    async def receive() -> dict[str, object]:
        if not body_read.is_set():
            body_read.set()
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await client_gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        raise AssertionError(f"nothing is sent to a client that left: {message}")

    middleware = cancel_on_disconnect(app)

    async def server_task() -> int:
        """The server's task for the request, as uvicorn runs it; how many cancels are left on it."""
        await middleware({"type": "http", "path": "/v1/chat/completions", "state": {}}, receive, send)  # type: ignore[arg-type]
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    serving = asyncio.create_task(server_task())
    await body_read.wait()
    client_gone.set()
    async with asyncio.timeout(5):
        assert await serving == 0, "the request ended, and the server's task was not left cancelled"
    assert ran_in == [serving], "no task of its own: the app started in the server's turn"
