"""Slow and greedy clients against the front door's real server, over real sockets.

A slowloris (headers trickled, or none at all) is closed after the header timeout; an upload that
stops midway is closed and counted as the client's doing (499); past the connection cap a new
connection is refused at once while the ones that behave are served once room frees; and a stream
that lasts longer than every timeout is not cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time

import httpx
import pytest
import redis.asyncio as aioredis

from router.http.connections import MAX_HEADER_BYTES
from switchboard.config import Settings
from switchboard.local.redis_server import PrivateRedis
from switchboard.ports import free_port
from switchboard.wire import Chunk, Usage
from tests.support.front_door_harness import BODY, next_job, serving, settings_for, write_chunks
from tests.support.metric_samples import counter

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
            assert silent_answer == b"", "nothing asked, nothing answered: only closed"
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
        before = counter("switchboard:requests", model="", route="", status="499")
        errors_before = counter("switchboard:requests", model="", route="", status="500")
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
            if counter("switchboard:requests", model="", route="", status="499") > before:
                break
            await asyncio.sleep(0.02)
        assert counter("switchboard:requests", model="", route="", status="499") == before + 1
        assert counter("switchboard:requests", model="", route="", status="500") == errors_before


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


async def test_a_kept_alive_connection_fed_bare_line_ends_is_closed_in_time(
    redis_server: PrivateRedis,
) -> None:
    async with serving(slow_client_settings(redis_server.url)) as client:
        reader, writer = await raw_connection(client)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")  # the answer's head; its body follows

        async def line_ends() -> None:  # bytes that begin no request, each restarting uvicorn's timer
            while not writer.is_closing():
                writer.write(b"\r\n")
                await asyncio.sleep(KEEP_ALIVE_S / 5)

        feeding = asyncio.create_task(line_ends())
        try:
            waited, _ = await closed_within(reader, 5 * KEEP_ALIVE_S)
        finally:
            feeding.cancel()
            writer.close()
        assert waited < 3 * KEEP_ALIVE_S


async def test_headers_past_the_size_limit_are_a_431(redis_server: PrivateRedis) -> None:
    async with serving(slow_client_settings(redis_server.url)) as client:
        reader, writer = await raw_connection(client)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for _ in range(MAX_HEADER_BYTES // 1000 + 2):
            writer.write(b"X-Big: " + b"a" * 990 + b"\r\n")
        try:
            _, answer = await closed_within(reader, 5 * HEADER_TIMEOUT_S)
        finally:
            writer.close()
        assert answer.startswith(b"HTTP/1.1 431 ")


async def test_a_flood_of_malformed_requests_is_one_log_line(
    redis_server: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    async with serving(slow_client_settings(redis_server.url)) as client:
        with caplog.at_level(logging.WARNING):
            for _ in range(30):
                reader, writer = await raw_connection(client)
                writer.write(b"NOT HTTP AT ALL\r\n\r\n")
                await closed_within(reader, 2)
                writer.close()
        malformed = [r for r in caplog.records if "Invalid HTTP request" in r.getMessage()]
        assert len(malformed) == 1, [r.getMessage() for r in malformed]


# Runs the front door in a process allowed 128 open files, as the attack found it.
FEW_FILES_SERVER = """
import asyncio, resource, sys
import uvicorn
from router.app import create_app
from router.server import server_config
from tests.support.front_door_harness import settings_for
resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
settings = settings_for(sys.argv[1])
settings.router.port = int(sys.argv[2])
settings.router.header_timeout_s = float(sys.argv[3])
uvicorn.Server(server_config(create_app(settings), settings)).run()
"""


async def test_with_128_files_200_slow_connections_leave_the_door_open(redis_server: PrivateRedis) -> None:
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-c", FEW_FILES_SERVER, redis_server.url, str(port), str(2 * HEADER_TIMEOUT_S)
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=5) as client:
            for _ in range(300):
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get("/healthz")).status_code == 200:
                        break
                await asyncio.sleep(0.05)
        slow = [await asyncio.open_connection("127.0.0.1", port) for _ in range(200)]
        for _, writer in slow:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the end
        # Those past the cap (128 files less what the process keeps for itself) are refused at once.
        refused = 0
        for reader, _ in slow:
            with contextlib.suppress(TimeoutError):
                try:
                    _, answer = await closed_within(reader, 0.05)
                except ConnectionResetError:
                    # The 503 was sent, but the request bytes the server never read made the kernel
                    # answer the close with a reset, which may discard the 503 before it is read.
                    refused += 1
                    continue
                refused += answer.startswith(b"HTTP/1.1 503 ")
        assert refused >= 200 - 128
        # The rest are closed at the header timeout, and the door serves again.
        async with httpx.AsyncClient(base_url=base, timeout=5) as client:
            for _ in range(100):
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get("/healthz")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
            assert (await client.get("/healthz")).status_code == 200
        for _, writer in slow:
            writer.close()
    finally:
        server.terminate()
        await server.wait()
