"""Slow and greedy clients against the front door's real server, over real sockets.

A slowloris (headers trickled, or none at all) is closed after the header timeout; an upload that
stops midway, trickles a byte at a time or outlasts its deadline is closed and counted as the
client's doing (499); an answer given before the body was read closes its connection (the client
still sees it); a client that stops reading its stream is cut off and its job cancelled; past the
connection cap a new connection is refused at once while the ones that behave are served once room
frees; and a stream that lasts longer than every timeout, to a client that reads it, is not cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import sys
import time

import httpx
import pytest
import redis.asyncio as aioredis

from router.http.connections import MAX_HEADER_BYTES
from switchboard import keys
from switchboard.config import Settings
from switchboard.local.redis_server import PrivateRedis
from switchboard.ports import free_port
from switchboard.wire import Chunk, Usage
from tests.support.front_door_harness import BODY, next_job, serving, settings_for, write_chunks
from tests.support.metric_samples import counter
from tests.support.waits import eventually

# Short limits, so that each case takes about a second.
HEADER_TIMEOUT_S = 0.5
BODY_TIMEOUT_S = 0.5
BODY_GRACE_S = 0.5
BODY_MIN_RATE = 1000.0
BODY_DEADLINE_S = 1.5
SEND_STALL_S = 0.5
SEND_TIMEOUT_S = 0.5
KEEP_ALIVE_S = 0.5


def slow_client_settings(redis_url: str, *, max_connections: int = 4096) -> Settings:
    settings = settings_for(redis_url, first_byte_budget_s=0.1, resume_grace_s=0)
    settings.router.header_timeout_s = HEADER_TIMEOUT_S
    settings.router.body_timeout_s = BODY_TIMEOUT_S
    settings.router.body_rate_grace_s = BODY_GRACE_S
    settings.router.body_min_rate_bytes_s = BODY_MIN_RATE
    settings.router.body_deadline_s = BODY_DEADLINE_S
    settings.router.send_stall_timeout_s = SEND_STALL_S
    settings.router.send_timeout_s = SEND_TIMEOUT_S
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
        try:
            while chunk := await reader.read(65536):
                received += chunk
        except ConnectionResetError:
            # Closed while the client was still sending: the kernel answers the bytes that arrive
            # after the close with a reset, which ends the connection as surely as an end of file.
            pass
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


def upload_head(
    length: int, *, path: str = "/v1/chat/completions", content_type: str = "application/json"
) -> bytes:
    """A request's line and headers, announcing a body of `length` bytes."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def padded_body(size: int) -> bytes:
    """A chat request of about `size` bytes (its message padded)."""
    return json.dumps({**BODY, "messages": [{"role": "user", "content": "x" * size}]}).encode()


async def test_a_body_trickled_a_byte_at_a_time_is_closed_past_its_grace(redis_server: PrivateRedis) -> None:
    async with serving(slow_client_settings(redis_server.url)) as client:
        closed_before = counter("switchboard:connections_closed", reason="body_too_slow")
        left_before = counter("switchboard:requests", model="", route="", status="499")
        reader, writer = await raw_connection(client)
        body = padded_body(2000)
        writer.write(upload_head(len(body)))

        async def trickle() -> None:  # never pausing as long as the body timeout: 20 bytes/s
            for byte in body[:-1]:
                writer.write(bytes([byte]))
                await asyncio.sleep(BODY_TIMEOUT_S / 10)

        trickling = asyncio.create_task(trickle())
        try:
            waited, _ = await closed_within(reader, 10 * BODY_GRACE_S)
        finally:
            trickling.cancel()
            writer.close()
        assert waited < BODY_GRACE_S + 1.0
        assert counter("switchboard:connections_closed", reason="body_too_slow") == closed_before + 1

        async def counted_as_the_clients() -> bool:
            return counter("switchboard:requests", model="", route="", status="499") == left_before + 1

        await eventually(counted_as_the_clients, timeout_s=2)


async def test_a_body_not_whole_by_its_deadline_is_closed_whatever_its_rate(
    redis_server: PrivateRedis,
) -> None:
    async with serving(slow_client_settings(redis_server.url)) as client:
        before = counter("switchboard:connections_closed", reason="body_deadline")
        reader, writer = await raw_connection(client)
        body = padded_body(400_000)  # 4 s at 100 KB/s: a hundred times the minimum rate
        writer.write(upload_head(len(body)))

        async def steady() -> None:
            for start in range(0, len(body), 2000):
                writer.write(body[start : start + 2000])
                await asyncio.sleep(0.02)

        sending = asyncio.create_task(steady())
        try:
            waited, _ = await closed_within(reader, 4 * BODY_DEADLINE_S)
        finally:
            sending.cancel()
            writer.close()
        # Within 2 s of the deadline (a busy machine is late), and well before the body (4 s) is whole.
        assert BODY_DEADLINE_S - 0.1 < waited < BODY_DEADLINE_S + 2.0
        assert counter("switchboard:connections_closed", reason="body_deadline") == before + 1


@pytest.mark.parametrize(
    ("path", "content_type", "status"),
    [("/v1/nowhere", "application/json", 404), ("/v1/chat/completions", "text/plain", 415)],
)
async def test_an_answer_given_before_the_body_was_read_closes_the_connection(
    redis_server: PrivateRedis, path: str, content_type: str, status: int
) -> None:
    settings = slow_client_settings(redis_server.url)
    # Far body limits: only the early answer can end the connection in time.
    settings.router.body_timeout_s = settings.router.body_rate_grace_s = 10.0
    settings.router.body_deadline_s = 30.0
    size = 1_000_000
    async with serving(settings) as client:
        before = counter("switchboard:connections_closed", reason="answered_before_body")
        reader, writer = await raw_connection(client)
        writer.write(upload_head(size, path=path, content_type=content_type) + b"x" * 1000)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(f"HTTP/1.1 {status} ".encode())
            assert b"\r\nconnection: close\r\n" in head.lower()
            # A client that goes on sending its body is not reset: it reads its answer whole.
            writer.write(b"x" * (size - 1000))
            await writer.drain()
            waited, rest = await closed_within(reader, 5)
        finally:
            writer.close()
        assert waited < 2.0
        assert json.loads(rest)["error"]["message"]
        assert counter("switchboard:connections_closed", reason="answered_before_body") == before + 1


async def test_a_request_whose_body_was_read_keeps_its_connection(redis_server: PrivateRedis) -> None:
    async with serving(slow_client_settings(redis_server.url)) as client:
        reader, writer = await raw_connection(client)
        try:
            for _ in range(2):  # not JSON: a 400, once the body is read
                writer.write(upload_head(5) + b"nope!")
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                assert head.startswith(b"HTTP/1.1 400 ") and b"connection: close" not in head.lower()
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
        finally:
            writer.close()


async def small_window_connection(
    client: httpx.AsyncClient,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection whose receive buffers are small, so that a client that stops reading fills them
    (and the front door's) soon."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, address(client))
    return await asyncio.open_connection(sock=sock, limit=4096)


async def start_stream(client: httpx.AsyncClient) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A streamed chat request on a small-window connection, its answer's head read."""
    reader, writer = await small_window_connection(client)
    body = json.dumps({**BODY, "stream": True}).encode()
    writer.write(upload_head(len(body)) + body)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 200 ")
    return reader, writer


BIG_CHUNK = Chunk(text="x" * 64 * 1024)


async def test_a_client_that_stops_reading_its_stream_is_cut_off_and_its_job_cancelled(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(slow_client_settings(redis_server.url)) as client:
        stalls_before = counter("switchboard:connections_closed", reason="send_stall")
        left_before = counter("switchboard:requests", model="tiny", route="", status="499")
        starting = asyncio.create_task(start_stream(client))
        job = await next_job(redis)
        await write_chunks(redis, job.id, Chunk(text="first"))
        reader, writer = await starting
        # Far more than the buffers on the way hold; the client reads none of it.
        for _ in range(64):
            await write_chunks(redis, job.id, BIG_CHUNK)
        try:

            async def cut_off() -> bool:
                return counter("switchboard:connections_closed", reason="send_stall") == stalls_before + 1

            await eventually(cut_off, timeout_s=10 * SEND_STALL_S)

            async def cancelled() -> bool:
                return bool(await redis.exists(keys.cancel_mark(job.id)))

            await eventually(cancelled, timeout_s=5, what="the job's cancel mark")

            async def counted_as_the_clients() -> bool:
                return (
                    counter("switchboard:requests", model="tiny", route="", status="499") == left_before + 1
                )

            await eventually(counted_as_the_clients, timeout_s=5)
            with contextlib.suppress(ConnectionResetError):
                await closed_within(reader, 5)  # what the buffers held, then the end
        finally:
            writer.close()


async def test_a_client_that_reads_a_large_stream_slowly_is_not_cut(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    chunks = 56  # 3.6 MB: more than the kernel's buffers on the way (2.8 MB on loopback)
    async with serving(slow_client_settings(redis_server.url)) as client:
        stalls_before = counter("switchboard:connections_closed", reason="send_stall")
        starting = asyncio.create_task(start_stream(client))
        job = await next_job(redis)
        await write_chunks(redis, job.id, Chunk(text="first"))
        reader, writer = await starting
        for _ in range(chunks):
            await write_chunks(redis, job.id, BIG_CHUNK)
        usage = Usage(prompt_tokens=1, completion_tokens=chunks + 2)
        await write_chunks(redis, job.id, Chunk(text="end", finish_reason="stop", usage=usage))
        started = time.monotonic()
        received = bytearray()
        try:
            # Half a megabyte at a time, then a pause well within the stall timeout: the front door's
            # writing is paused again and again, and never cut.
            while b"data: [DONE]" not in received[-100:]:
                burst_end = len(received) + 512 * 1024
                while len(received) < burst_end and b"data: [DONE]" not in received[-100:]:
                    piece = await asyncio.wait_for(reader.read(65536), 5)
                    assert piece, "the front door closed the stream"
                    received += piece
                await asyncio.sleep(SEND_STALL_S / 4)
        finally:
            writer.close()
        assert time.monotonic() - started > SEND_STALL_S
        assert received.count(b"x" * 1024) >= chunks * 64
        assert counter("switchboard:connections_closed", reason="send_stall") == stalls_before


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
