"""The budgets of request bodies in flight (router/http/body_budget.py), over real sockets.

`read_body` runs in a small Litestar app served by uvicorn with the front door's own connection
protocol: a key's bodies past its budget are a 429 while another key gets in, bodies past the front
door's budget a 503, a body past the largest size a 413 that holds nothing, and whatever way a read
ends (whole, refused midway, abandoned by its client), its bytes are given back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import httpx
import msgspec
import pytest
import uvicorn
from litestar import Litestar, Request, Response, post

from router.http.body_budget import BodyBudget, read_body
from router.http.connection_limits import ConnectionLimits
from router.http.connections import guarded_protocol
from router.openai.errors import OpenAIError
from switchboard.config import FrontDoorConfig, Settings
from tests.support.waits import eventually

MAX_BODY = 1_000_000
PER_KEY = 2 * MAX_BODY
TOTAL = 3 * MAX_BODY
KEY_HEADER = "x-test-key"


@post("/read", status_code=200)
async def read(request: Request[Any, Any, Any]) -> dict[str, int]:
    body = await read_body(request, request.headers.get(KEY_HEADER, "anonymous"))
    return {"bytes": len(body)}


def openai_error(_: Request[Any, Any, Any], exc: OpenAIError) -> Response[bytes]:
    return Response(msgspec.json.encode(exc.body()), status_code=exc.status_code, headers=exc.headers)


@contextlib.asynccontextmanager
async def serving(budget: BodyBudget) -> AsyncIterator[tuple[str, int]]:
    """An app that reads bodies with `read_body` within `budget`, on a real port: its address."""
    app = Litestar([read], exception_handlers={OpenAIError: openai_error}, request_max_body_size=MAX_BODY)
    app.state.front_door = SimpleNamespace(body_budget=budget)
    config = uvicorn.Config(
        app, port=0, http=guarded_protocol(ConnectionLimits()), lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[:2]
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def budget() -> BodyBudget:
    return BodyBudget(per_key=PER_KEY, total=TOTAL)


def head(key: str, length: int | None) -> bytes:
    sized = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return f"POST /read HTTP/1.1\r\nHost: 127.0.0.1\r\n{KEY_HEADER}: {key}\r\n{sized}\r\n\r\n".encode()


async def partial_body(
    address: tuple[str, int], key: str, length: int = MAX_BODY
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that announces a `length`-byte body and sends only its first kilobytes."""
    reader, writer = await asyncio.open_connection(*address)
    writer.write(head(key, length) + b"x" * 10_000)
    await writer.drain()
    return reader, writer


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes, dict[str, Any]]:
    """The status, head and JSON body of the answer on a raw connection."""
    answer_head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = int(answer_head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    body = json.loads(await asyncio.wait_for(reader.readexactly(length), 5))
    return int(answer_head.split(b" ")[1]), answer_head.lower(), body


async def held(budget: BodyBudget, key: str, size: int) -> None:
    async def reserved() -> bool:
        return budget.of_key(key) == size

    await eventually(reserved, timeout_s=5, what=f"{size} bytes held for {key}")


async def test_a_keys_large_bodies_past_its_budget_are_a_429_while_another_key_gets_in(
    budget: BodyBudget,
) -> None:
    async with serving(budget) as address:
        hogs = [await partial_body(address, "greedy") for _ in range(2)]
        await held(budget, "greedy", PER_KEY)
        reader, writer = await partial_body(address, "greedy")
        status, answer_head, body = await answer(reader)
        assert status == 429
        assert body["error"]["code"] == "too_many_body_bytes"
        assert b"retry-after: 1\r\n" in answer_head
        assert b"connection: close\r\n" in answer_head  # its body unread: the connection ends
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        async with httpx.AsyncClient(base_url=f"http://{address[0]}:{address[1]}") as client:
            other = await client.post("/read", content=b"y" * MAX_BODY, headers={KEY_HEADER: "polite"})
        assert other.status_code == 200 and other.json() == {"bytes": MAX_BODY}
        assert budget.of_key("polite") == 0
        assert budget.of_key("greedy") == PER_KEY
        for _, hog in hogs:
            hog.close()


async def test_past_the_front_doors_budget_a_body_is_a_503(budget: BodyBudget) -> None:
    async with serving(budget) as address:
        hogs = [await partial_body(address, f"key{n}") for n in range(3)]
        await held(budget, "key2", MAX_BODY)
        assert budget.in_flight == TOTAL
        async with httpx.AsyncClient(base_url=f"http://{address[0]}:{address[1]}") as client:
            refused = await client.post("/read", content=b"{}", headers={KEY_HEADER: "newcomer"})
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "too_many_body_bytes"
        assert refused.headers["retry-after"] == "1"
        for _, hog in hogs:
            hog.close()


async def test_a_reads_bytes_are_given_back_however_it_ends(budget: BodyBudget) -> None:
    async with serving(budget) as address:
        _, abandoned = await partial_body(address, "k")
        _, holder = await partial_body(address, "k", MAX_BODY // 2)
        await held(budget, "k", MAX_BODY + MAX_BODY // 2)
        abandoned.close()  # the client leaves midway
        await held(budget, "k", MAX_BODY // 2)
        _, second_holder = await partial_body(address, "k")
        await held(budget, "k", MAX_BODY + MAX_BODY // 2)
        # A chunked body is held as it comes: past what the key has left, it is refused midway.
        reader, writer = await asyncio.open_connection(*address)
        writer.write(head("k", None))
        for _ in range(8):
            writer.write(b"%x\r\n%s\r\n" % (100_000, b"z" * 100_000))
        await writer.drain()
        status, _, body = await answer(reader)
        assert status == 429 and body["error"]["code"] == "too_many_body_bytes"
        writer.close()
        await held(budget, "k", MAX_BODY + MAX_BODY // 2)
        holder.close()
        second_holder.close()
        await held(budget, "k", 0)
        assert budget.in_flight == 0


async def test_a_body_past_the_largest_taken_is_a_413_that_holds_nothing(budget: BodyBudget) -> None:
    async with serving(budget) as address:
        reader, writer = await asyncio.open_connection(*address)
        writer.write(head("k", MAX_BODY + 1) + b"x" * 1000)
        status, _, body = await answer(reader)
        writer.close()
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert budget.in_flight == 0


def test_unset_budgets_hold_two_of_the_largest_bodies_per_key_and_32_in_all() -> None:
    router = FrontDoorConfig(max_body_bytes=10 * 1024 * 1024)
    assert (BodyBudget.of(router).per_key, BodyBudget.of(router).total) == (20 * 1024**2, 320 * 1024**2)
    set_budgets = FrontDoorConfig(
        max_body_bytes_in_flight_per_key=50 * 1024**2, max_body_bytes_in_flight=2**30
    )
    assert (BodyBudget.of(set_budgets).per_key, BodyBudget.of(set_budgets).total) == (50 * 1024**2, 2**30)


@pytest.mark.parametrize(
    "router",
    [
        {"max_body_bytes_in_flight_per_key": 1024 * 1024},  # below the 10 MiB a body may be
        {"max_body_bytes_in_flight_per_key": 20 * 1024**2, "max_body_bytes_in_flight": 12 * 1024**2},
    ],
)
def test_a_budget_that_a_largest_body_would_not_fit_is_refused_at_start(router: dict[str, int]) -> None:
    with pytest.raises(msgspec.ValidationError, match="must be at least"):
        msgspec.convert({"router": router}, Settings)
