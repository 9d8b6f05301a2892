"""Two front-door processes on one Redis share the keys and every limit.

Real parts: a redis-server, two `switchboard router` processes, keys made by the `switchboard keys
add` command, and the `openai` client as the caller. The test plays the worker: it takes jobs from
the model's stream with the real consumer group and answers them when it chooses, so that
requests can be held in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from switchboard import keys
from switchboard.local.redis_server import PrivateRedis
from switchboard.ports import free_port
from switchboard.tasks import cancel_and_wait
from switchboard.wire import Chunk, Job, Usage, encode, job_decoder

SERVED = "tiny"  # the test answers its jobs
UNSERVED = "other"  # nobody does: its jobs wait
MAX_IN_FLIGHT = 6
CONFIG = f"""
[router]
request_timeout_s = 8

[limits]
max_in_flight = {MAX_IN_FLIGHT}
max_queue_depth = 2

[[models]]
name = "{SERVED}"
path = "/nonexistent"

[[models]]
name = "{UNSERVED}"
path = "/nonexistent"
"""
KEYS = {
    "ops": ["--admin"],
    "tiny-only": ["--models", SERVED],
    "rpm": ["--rpm", "3"],
    "parallel": ["--parallel", "2"],
    "tokens": ["--tpm", "100"],
}


@dataclass
class Deployment:
    redis_url: str
    urls: list[str]
    secrets: dict[str, str]
    # The clients of the running test (each belongs to its event loop); closed when it ends.
    clients: list[openai.AsyncOpenAI] = field(default_factory=list)

    def client(self, door: int, key: str | None) -> openai.AsyncOpenAI:
        """The openai client of front door `door` with key `key` (None: a key nobody made)."""
        secret = self.secrets[key] if key else "sb-" + "x" * 43
        client = openai.AsyncOpenAI(base_url=f"{self.urls[door]}/v1", api_key=secret, max_retries=0)
        self.clients.append(client)
        return client


def _switchboard(config: Path, *argv: str) -> list[str]:
    return [sys.executable, "-m", "switchboard", "--config", str(config), *argv]


def _wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"front door exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/healthz", timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"front door at {url} did not start:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    folder = tmp_path_factory.mktemp("two-doors")
    config = folder / "switchboard.toml"
    config.write_text(CONFIG)
    with PrivateRedis() as server:
        env = {**os.environ, "REDIS_URL": server.url}
        secrets = {}
        for name, flags in KEYS.items():
            made = subprocess.run(
                _switchboard(config, "keys", "add", name, *flags),
                env=env,
                capture_output=True,
                check=True,
                timeout=60,
            )
            secrets[name] = made.stdout.decode().strip()
        processes: list[subprocess.Popen[bytes]] = []
        urls = []
        try:
            for door in range(2):
                port = free_port()
                log = folder / f"router-{door}.log"
                with log.open("wb") as output:
                    argv = _switchboard(config, "router", "--port", str(port))
                    processes.append(subprocess.Popen(argv, env=env, stdout=output, stderr=subprocess.STDOUT))
                urls.append(f"http://127.0.0.1:{port}")
                _wait_healthy(urls[-1], processes[-1], log)
            yield Deployment(redis_url=server.url, urls=urls, secrets=secrets)
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


@pytest.fixture
async def doors(deployment: Deployment) -> AsyncIterator[Deployment]:
    """The deployment, for one test: the clients it makes are closed at its end."""
    try:
        yield deployment
    finally:
        for client in deployment.clients:
            await client.close()
        deployment.clients.clear()


class ScriptedWorker:
    """Takes every job of SERVED with the real consumer group; answers when told (or at once)."""

    def __init__(self, redis: aioredis.Redis, *, answer_at_once: bool) -> None:
        self._redis = redis
        self._answer_at_once = answer_at_once
        self.jobs: asyncio.Queue[tuple[Job, bytes]] = asyncio.Queue()

    async def run(self) -> None:
        stream = keys.job_stream(SERVED)
        with contextlib.suppress(ResponseError):
            await self._redis.xgroup_create(stream, keys.JOB_GROUP, id="0", mkstream=True)
        while True:
            response = await self._redis.xreadgroup(keys.JOB_GROUP, "scripted", {stream: ">"}, block=100)
            for _, entries in response or ():
                for entry_id, fields in entries:
                    job = job_decoder.decode(fields[b"job"])
                    if self._answer_at_once:
                        await self.answer(job, entry_id)
                    else:
                        self.jobs.put_nowait((job, entry_id))

    async def taken(self, count: int, requests: list[asyncio.Task[str | None]]) -> list[tuple[Job, bytes]]:
        """The next `count` jobs taken (and held); a request that ends meanwhile fails the test."""
        jobs: list[tuple[Job, bytes]] = []
        async with asyncio.timeout(60):
            while len(jobs) < count:
                getting = asyncio.ensure_future(self.jobs.get())
                await asyncio.wait([getting, *requests], return_when=asyncio.FIRST_COMPLETED)
                if not getting.done():
                    getting.cancel()
                    ended = next(r for r in requests if r.done())
                    pytest.fail(
                        f"a request ended before its job was taken: {ended.exception() or ended.result()}"
                    )
                jobs.append(getting.result())
        return jobs

    async def answer(self, job: Job, entry_id: bytes, tokens: int = 2) -> None:
        """The job's only chunk, with `tokens` of usage, then its acknowledgement."""
        usage = Usage(prompt_tokens=tokens // 2, completion_tokens=tokens - tokens // 2)
        stream = keys.job_stream(SERVED)
        pipe = self._redis.pipeline()
        pipe.xadd(
            keys.result_stream(job.id), {"c": encode(Chunk(text="ok", finish_reason="stop", usage=usage))}
        )
        pipe.expire(keys.result_stream(job.id), keys.RESULT_TTL_S)
        pipe.xack(stream, keys.JOB_GROUP, entry_id)
        pipe.xdel(stream, entry_id)
        await pipe.execute()


@contextlib.asynccontextmanager
async def scripted_worker(deployment: Deployment, *, answer_at_once: bool) -> AsyncIterator[ScriptedWorker]:
    redis = aioredis.Redis.from_url(deployment.redis_url)
    worker = ScriptedWorker(redis, answer_at_once=answer_at_once)
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        # Its loop blocks in redis-py, which can lose one cancellation (see switchboard.tasks).
        await cancel_and_wait(task)
        await redis.aclose()


async def chat(client: openai.AsyncOpenAI, model: str = SERVED, max_tokens: int = 1) -> str | None:
    reply = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=max_tokens
    )
    return reply.choices[0].message.content


def started(client: openai.AsyncOpenAI, max_tokens: int = 1, model: str = SERVED) -> asyncio.Task[str | None]:
    return asyncio.create_task(chat(client, model, max_tokens))


async def test_both_front_doors_know_every_key(doors: Deployment) -> None:
    for door in range(2):
        with pytest.raises(openai.AuthenticationError) as unknown:
            await doors.client(door, None).models.list()
        assert unknown.value.code == "invalid_api_key"
        assert "sb-xx***xxxx" in unknown.value.message
        listed = await doors.client(door, "tiny-only").models.list()
        assert [m.id for m in listed.data] == [SERVED]
        with pytest.raises(openai.PermissionDeniedError) as denied:
            await chat(doors.client(door, "tiny-only"), UNSERVED)
        assert denied.value.code == "model_not_allowed"
        async with httpx.AsyncClient(base_url=doors.urls[door]) as admin:
            assert (await admin.get("/admin/models")).status_code == 401
            as_user = {"Authorization": f"Bearer {doors.secrets['tiny-only']}"}
            assert (await admin.get("/admin/models", headers=as_user)).status_code == 403
            as_ops = {"Authorization": f"Bearer {doors.secrets['ops']}"}
            assert (await admin.get("/admin/models", headers=as_ops)).status_code == 200
            assert (await admin.get("/healthz")).status_code == 200


async def test_requests_per_minute_are_counted_across_front_doors(doors: Deployment) -> None:
    async with scripted_worker(doors, answer_at_once=True):
        assert await chat(doors.client(0, "rpm")) == "ok"
        assert await chat(doors.client(1, "rpm")) == "ok"
        assert await chat(doors.client(0, "rpm")) == "ok"
        for door in range(2):
            with pytest.raises(openai.RateLimitError) as limited:
                await chat(doors.client(door, "rpm"))
            assert limited.value.code == "rate_limit_exceeded"
            assert 1 <= int(limited.value.response.headers["Retry-After"]) <= 20
        assert await chat(doors.client(1, "ops")) == "ok"  # other keys are not held back


async def test_parallel_requests_are_counted_across_front_doors(doors: Deployment) -> None:
    async with scripted_worker(doors, answer_at_once=False) as worker:
        held = [started(doors.client(0, "parallel")), started(doors.client(1, "parallel"))]
        (first, second) = await worker.taken(2, held)
        for door in range(2):
            with pytest.raises(openai.RateLimitError) as limited:
                await chat(doors.client(door, "parallel"))
            assert "2 requests in flight" in limited.value.message
            assert limited.value.response.headers["Retry-After"] == "1"
        await worker.answer(*first)
        await asyncio.wait(held, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        # Whichever front door that request came through, its slot is free on both.
        extra = [started(doors.client(1, "parallel"))]
        (third,) = await worker.taken(1, extra)
        await worker.answer(*second)
        await worker.answer(*third)
        assert await asyncio.wait_for(asyncio.gather(*held, *extra), 60) == ["ok", "ok", "ok"]


async def test_tokens_per_minute_are_reserved_and_settled_across_front_doors(doors: Deployment) -> None:
    async with scripted_worker(doors, answer_at_once=False) as worker:
        # About 61 tokens reserved on door 0: the same again on door 1 exceeds 100 per minute.
        first = started(doors.client(0, "tokens"), max_tokens=60)
        ((job, entry_id),) = await worker.taken(1, [first])
        with pytest.raises(openai.RateLimitError) as limited:
            await chat(doors.client(1, "tokens"), max_tokens=60)
        assert limited.value.type == "tokens"
        # It used 4 tokens: the rest comes back when it ends, and door 1 admits the request.
        await worker.answer(job, entry_id, tokens=4)
        assert await asyncio.wait_for(first, 60) == "ok"
        second = started(doors.client(1, "tokens"), max_tokens=60)
        ((job, entry_id),) = await worker.taken(1, [second])
        await worker.answer(job, entry_id, tokens=4)
        assert await asyncio.wait_for(second, 60) == "ok"


async def test_in_flight_requests_and_queue_depth_are_bounded_across_front_doors(
    doors: Deployment,
) -> None:
    async with scripted_worker(doors, answer_at_once=False) as worker:
        # One at a time, each taken before the next is sent: sent together, they could find the
        # queue full (max_queue_depth) whenever the scripted worker is slower than their arrival.
        held: list[asyncio.Task[str | None]] = []
        taken: list[tuple[Job, bytes]] = []
        for door in range(MAX_IN_FLIGHT):
            held.append(started(doors.client(door % 2, "ops")))
            taken += await worker.taken(1, held)
        for door in range(2):
            with pytest.raises(openai.RateLimitError) as busy:
                await chat(doors.client(door, "ops"))
            assert busy.value.code == "server_busy"
        for job, entry_id in taken:
            await worker.answer(job, entry_id)
        assert await asyncio.wait_for(asyncio.gather(*held), 60) == ["ok"] * MAX_IN_FLIGHT
    # Nobody takes UNSERVED's jobs: two wait (one per front door), the third finds the queue full.
    waiting = [started(doors.client(door, "ops"), model=UNSERVED) for door in range(2)]
    redis = aioredis.Redis.from_url(doors.redis_url)
    try:
        for _ in range(400):
            if await redis.xlen(keys.job_stream(UNSERVED)) == 2:
                break
            await asyncio.sleep(0.05)
        with pytest.raises(openai.RateLimitError) as full:
            await chat(doors.client(1, "ops"), UNSERVED)
        assert full.value.code == "queue_full"
        for request in waiting:
            request.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
    finally:
        await redis.delete(keys.job_stream(UNSERVED))
        await redis.aclose()
