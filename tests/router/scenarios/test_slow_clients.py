"""Slow and greedy clients against the front door's real server, over real sockets.

A slowloris (headers trickled, or none at all) is closed after the header timeout; an upload that
stops midway is closed and counted as the client's doing (499); past the connection cap a new
connection is refused at once while the ones that behave are served once room frees; and a stream
that lasts longer than every timeout is not cut.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import redis.asyncio as aioredis

from switchboard.config import Settings
from switchboard.local.redis_server import PrivateRedis
from switchboard.metrics import REGISTRY
from switchboard.wire import Chunk, Usage
from tests.support.front_door_harness import BODY, next_job, serving, settings_for, write_chunks

# Short limits, so that each case takes about a second.
HEADER_TIMEOUT_S = 0.5
BODY_TIMEOUT_S = 0.5
KEEP_ALIVE_S = 0.5


def slow_client_settings(redis_url: str, *, max_connections: int = 4096) -> Settings:
    settings = settings_for(redis_url, first_byte_budget_s=0.1)
    settings.router.header_timeout_s = HEADER_TIMEOUT_S
    settings.router.body_timeout_s = BODY_TIMEOUT_S
    settings.router.keep_alive_timeout_s = KEEP_ALIVE_S
    settings.router.max_connections = max_connections
    return settings


def address(client: httpx.AsyncClient) -> tuple[str, int]:
    return client.base_url.host, int(client.base_url.port or 80)


async def raw_connection(client: httpx.AsyncClient) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A bare TCP connection to the front door that `client` talks to."""
    return await asyncio.open_connection(*address(client))


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> tuple[float, bytes]:
    """How long until the server closed the connection, and what it sent before (fails past `seconds`)."""
    started = time.monotonic()
    received = b""
    async with asyncio.timeout(seconds):
        while chunk := await reader.read(65536):
            received += chunk
    return time.monotonic() - started, received


def counter(name: str, **labels: str) -> float:
    """The value of one sample of the front door's metrics (0 while it has none)."""
    return REGISTRY.get_sample_value(f"{name}_total", labels) or 0.0


async def test_a_slowloris_is_closed_after_the_header_timeout(redis_server: PrivateRedis) -> None:
    async with serving(slow_client_settings(redis_server.url)) as client:
        before = counter("switchboard:connections_closed", reason="header_timeout")
        reader, writer = await raw_connection(client)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")

        async def trickle() -> None:
            while not writer.is_closing():
                writer.write(b"X-Slow: 1\r\n")
                await asyncio.sleep(0.1)

        trickling = asyncio.create_task(trickle())
        silent_reader, silent_writer = await raw_connection(client)  # sends nothing at all
        try:
            waited, answer = await closed_within(reader, 5 * HEADER_TIMEOUT_S)
            assert waited < 3 * HEADER_TIMEOUT_S
            assert answer.startswith(b"HTTP/1.1 408 ")
            assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "request_timeout"
            _, silent_answer = await closed_within(silent_reader, 5 * HEADER_TIMEOUT_S)
            assert silent_answer.startswith(b"HTTP/1.1 408 ")
        finally:
            trickling.cancel()
            writer.close()
            silent_writer.close()
        after = counter("switchboard:connections_closed", reason="header_timeout")
        assert after - before == 2
        assert (await client.get("/healthz")).status_code == 200


async def test_an_upload_that_stops_midway_is_closed_and_counted_as_the_clients(
    redis_server: PrivateRedis,
) -> None:
    async with serving(slow_client_settings(redis_server.url)) as client:
        before = counter("switchboard:requests", model="", status="499")
        errors_before = counter("switchboard:requests", model="", status="500")
        reader, writer = await raw_connection(client)
        body = json.dumps(BODY).encode()
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:10]
        )
        try:
            waited, _ = await closed_within(reader, 10 * BODY_TIMEOUT_S)
        finally:
            writer.close()
        assert waited < 4 * BODY_TIMEOUT_S
        for _ in range(100):  # the handler hears the disconnect, then the request is counted
            if counter("switchboard:requests", model="", status="499") > before:
                break
            await asyncio.sleep(0.02)
        assert counter("switchboard:requests", model="", status="499") == before + 1
        assert counter("switchboard:requests", model="", status="500") == errors_before


async def test_past_the_connection_cap_new_connections_are_refused_at_once_until_room_frees(
    redis_server: PrivateRedis,
) -> None:
    cap = 4
    async with serving(slow_client_settings(redis_server.url, max_connections=cap)) as client:
        await client.aclose()  # its own kept-alive connection would take a place
        base = f"http://{address(client)[0]}:{address(client)[1]}"
        hogs = [await raw_connection(client) for _ in range(cap)]
        await asyncio.sleep(0.05)
        refused_reader, refused_writer = await raw_connection(client)
        waited, refused = await closed_within(refused_reader, 1.0)
        refused_writer.close()
        assert waited < 0.5
        assert refused.startswith(b"HTTP/1.1 503 ")
        assert b"retry-after: 1" in refused.lower()
        assert json.loads(refused.partition(b"\r\n\r\n")[2])["error"]["code"] == "too_many_connections"
        # The hogs are closed at the header timeout; a request that behaves is served after that.
        async with httpx.AsyncClient(base_url=base, timeout=5) as polite:
            deadline = time.monotonic() + 5 * HEADER_TIMEOUT_S
            while True:
                try:
                    response = await polite.get("/healthz")
                except httpx.TransportError:
                    response = None
                if response is not None and response.status_code == 200:
                    break
                assert time.monotonic() < deadline, "never served once the slow connections were closed"
                await asyncio.sleep(0.1)
        for _, writer in hogs:
            writer.close()


async def test_an_idle_kept_alive_connection_makes_room_for_a_new_one(redis_server: PrivateRedis) -> None:
    async with serving(slow_client_settings(redis_server.url, max_connections=1)) as client:
        await client.aclose()
        base = f"http://{address(client)[0]}:{address(client)[1]}"
        async with httpx.AsyncClient(base_url=base) as first, httpx.AsyncClient(base_url=base) as second:
            assert (await first.get("/healthz")).status_code == 200  # its connection stays open, idle
            assert (await second.get("/healthz")).status_code == 200


async def test_a_stream_longer_than_every_timeout_is_not_cut(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(slow_client_settings(redis_server.url)) as client:

        async def answer_slowly() -> None:
            job = await next_job(redis)
            for _ in range(6):
                await write_chunks(redis, job.id, Chunk(text="tick "))
                await asyncio.sleep(3 * max(HEADER_TIMEOUT_S, BODY_TIMEOUT_S, KEEP_ALIVE_S) / 6)
            usage = Usage(prompt_tokens=1, completion_tokens=7)
            await write_chunks(redis, job.id, Chunk(text="end", finish_reason="stop", usage=usage))

        worker = asyncio.create_task(answer_slowly())
        started = time.monotonic()
        async with client.stream("POST", "/v1/chat/completions", json={**BODY, "stream": True}) as response:
            assert response.status_code == 200
            events = [line async for line in response.aiter_lines() if line.startswith("data: ")]
        await worker
        assert time.monotonic() - started > 2 * HEADER_TIMEOUT_S
        assert events[-1] == "data: [DONE]"
        text = "".join(
            json.loads(event[6:])["choices"][0]["delta"].get("content") or ""
            for event in events[:-1]
            if json.loads(event[6:])["choices"]
        )
        assert text == "tick " * 6 + "end"
