"""Resumable streams: a client that lost its connection re-sends the request with `Last-Event-ID` to
any front door for the rest of the answer. A client that asks (`X-Switchboard-Resumable: 1`) gets
every event's id (its job and result stream entry); any other client counts the events it had and
names them with the response's `x-request-id` (the tests at the end).

Two front doors share one Redis; a scripted worker writes chunks slowly and stops, as a real worker
does, once the job has a cancel mark.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from openai import AsyncOpenAI

from switchboard import api_keys, keys
from switchboard.config import ApiKey, Settings
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import Chunk, Job, Usage
from tests.support.front_door_harness import BODY, MODEL, next_job, settings_for, write_chunks
from tests.support.front_door_harness import serving as plain_serving
from tests.support.waits import eventually

RESUMABLE_HEADER = "X-Switchboard-Resumable"
WORDS = ["one ", "two ", "three ", "four ", "five ", "six ", "seven ", "eight"]
STREAM = {**BODY, "stream": True}


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The front door, and a client that asks for resumable streams (events with `id:` lines)."""
    async with plain_serving(settings) as client:
        client.headers[RESUMABLE_HEADER] = "1"
        yield client


async def slow_worker(redis: aioredis.Redis, job: Job, every_s: float = 0.15) -> str:
    """Write WORDS one at a time, as a worker would; stop at a cancel mark. Returns how it finished."""
    for word in WORDS:
        if await redis.exists(keys.cancel_mark(job.id)):
            await write_chunks(
                redis, job.id, Chunk(finish_reason="abort", usage=Usage(prompt_tokens=1, completion_tokens=0))
            )
            return "abort"
        await write_chunks(redis, job.id, Chunk(text=word))
        await asyncio.sleep(every_s)
    await write_chunks(
        redis, job.id, Chunk(finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=8))
    )
    return "stop"


async def events(lines: AsyncIterator[str], count: int | None = None) -> list[tuple[str, str]]:
    """(id, data) of the next `count` events (every event, if None) of an SSE stream."""
    found: list[tuple[str, str]] = []
    event_id = ""
    async for line in lines:
        if line.startswith("id: "):
            event_id = line[len("id: ") :]
        elif line.startswith("data: "):
            found.append((event_id, line[len("data: ") :]))
            if count is not None and len(found) == count:
                break
    return found


def text_of(found: list[tuple[str, str]]) -> str:
    parts = []
    for _, data in found:
        if data != "[DONE]":
            parts.extend(choice["delta"].get("content") or "" for choice in json.loads(data)["choices"])
    return "".join(parts)


async def test_a_stream_resumes_through_another_front_door_with_the_rest_of_the_answer(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    first_settings = settings_for(redis_server.url, first_byte_budget_s=0.1, resume_grace_s=2.0)
    second_settings = settings_for(redis_server.url, first_byte_budget_s=0.1)
    async with serving(first_settings) as first, serving(second_settings) as second, asyncio.timeout(30):
        async with first.stream("POST", "/v1/chat/completions", json=STREAM) as response:
            job = await next_job(redis)
            worker = asyncio.create_task(slow_worker(redis, job))
            seen = await events(response.aiter_lines(), count=3)
        # The client's connection broke after three events; it comes back to the other front door.
        last_id = seen[-1][0]
        assert last_id.startswith(f"{job.id}:")
        resumed = await second.post("/v1/chat/completions", json=STREAM, headers={"Last-Event-ID": last_id})
        assert resumed.status_code == 200
        rest = await events(aiter_lines(resumed.text))
        assert await worker == "stop"  # the worker was not cancelled: a client came back in time
        await asyncio.sleep(2.5)  # past the first front door's grace: still no cancel mark
        assert not await redis.exists(keys.cancel_mark(job.id))
        # Read to its end, the result stream and the job's record stay only briefly.
        for key in (keys.result_stream(job.id), keys.job_record(job.id)):
            assert 0 < await redis.ttl(key) <= keys.FINISHED_RESULT_TTL_S

    assert text_of(seen) + text_of(rest) == "".join(WORDS)
    assert rest[-1][1] == "[DONE]"
    first_payload, resumed_payload = json.loads(seen[0][1]), json.loads(rest[0][1])
    assert resumed_payload["id"] == first_payload["id"] == f"chatcmpl-{job.id}"
    assert resumed_payload["created"] == first_payload["created"]
    assert "role" not in resumed_payload["choices"][0]["delta"]  # the client had it already
    assert all(event_id.startswith(f"{job.id}:") for event_id, _ in rest)
    assert await redis.xlen(keys.job_stream(MODEL)) == 1  # no second job


async def aiter_lines(text: str) -> AsyncIterator[str]:
    for line in text.splitlines():
        yield line


async def test_a_client_that_does_not_come_back_cancels_its_job_after_the_grace(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    settings = settings_for(redis_server.url, first_byte_budget_s=0.1, resume_grace_s=1.0)
    async with serving(settings) as client, asyncio.timeout(30):
        async with client.stream("POST", "/v1/chat/completions", json=STREAM) as response:
            job = await next_job(redis)
            worker = asyncio.create_task(slow_worker(redis, job, every_s=0.3))
            await events(response.aiter_lines(), count=2)
        left = asyncio.get_running_loop().time()
        await asyncio.sleep(0.5)
        assert not await redis.exists(keys.cancel_mark(job.id))  # within the grace
        # The stream is kept for a client that resumes, and expires on its own.
        assert 0 < await redis.ttl(keys.result_stream(job.id)) <= keys.RESULT_TTL_S
        assert await worker == "abort"
        assert asyncio.get_running_loop().time() - left >= 1.0


async def test_an_unknown_or_malformed_last_event_id_is_refused(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(settings_for(redis_server.url)) as client:
        unknown = await client.post(
            "/v1/chat/completions", json=STREAM, headers={"Last-Event-ID": f"{'ab' * 16}:1-0"}
        )
        malformed = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "x", "stream": True},
            headers={"Last-Event-ID": "nope"},
        )
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "stream_not_found"
    assert malformed.status_code == 400
    assert malformed.json()["error"]["code"] == "invalid_last_event_id"
    assert not await redis.exists(keys.job_stream(MODEL))  # neither queued a job


async def test_a_stream_read_to_its_end_can_still_be_resumed_for_its_last_events(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    """A connection that broke just before the last events reached the client: they are still there."""
    async with (
        serving(settings_for(redis_server.url, first_byte_budget_s=0.1)) as client,
        asyncio.timeout(30),
    ):
        async with client.stream("POST", "/v1/chat/completions", json=STREAM) as response:
            job = await next_job(redis)
            await slow_worker(redis, job, every_s=0)
            everything = await events(response.aiter_lines())
        # The client saw everything up to the fourth event only.
        resumed = await client.post(
            "/v1/chat/completions", json=STREAM, headers={"Last-Event-ID": everything[3][0]}
        )
    assert resumed.status_code == 200
    rest = await events(aiter_lines(resumed.text))
    assert text_of(everything[:4]) + text_of(rest) == "".join(WORDS)
    assert rest[-1][1] == "[DONE]"


@pytest.mark.parametrize("include_usage", [False, True], ids=["text", "with usage"])
async def test_a_stream_resumed_after_its_last_event_ends_at_once(
    redis: aioredis.Redis, redis_server: PrivateRedis, include_usage: bool
) -> None:
    """A client that lost only the stream's end (`[DONE]`) and resumed from the last event it had waited
    for more until the request's deadline, then got a timeout instead of the end of its answer."""
    body = {**STREAM, "stream_options": {"include_usage": include_usage}}
    settings = settings_for(redis_server.url, 3.0, first_byte_budget_s=0.1)
    async with serving(settings) as client, asyncio.timeout(30):
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            job = await next_job(redis)
            await slow_worker(redis, job, every_s=0)
            everything = await events(response.aiter_lines())
        last_event_id = everything[-1][0]  # the events of the last chunk, `[DONE]` among them
        assert last_event_id == everything[-2][0]
        started = asyncio.get_running_loop().time()
        async with asyncio.timeout(2):  # the deadline (3 s) would come later
            resumed = await client.post(
                "/v1/chat/completions", json=body, headers={"Last-Event-ID": last_event_id}
            )
        took_s = asyncio.get_running_loop().time() - started
        # The front door bounds the stream's expiry in its reader's next round trip, which may come a
        # moment after the answer has gone (a loaded machine: 20 ms later, measured).
        results = keys.result_stream(job.id)

        async def kept_briefly() -> bool:
            return await redis.ttl(results) <= keys.FINISHED_RESULT_TTL_S

        await eventually(
            kept_briefly, what=f"the result stream's expiry down to {keys.FINISHED_RESULT_TTL_S} s"
        )
        assert not await redis.exists(keys.cancel_mark(job.id))
    assert resumed.status_code == 200, resumed.text
    assert await events(aiter_lines(resumed.text)) == [(last_event_id, "[DONE]")]
    assert took_s < 1.0


async def test_two_clients_reading_one_stream_both_get_the_end_and_one_leaving_cancels_nothing(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    settings = settings_for(redis_server.url, first_byte_budget_s=0.1, resume_grace_s=0.5)
    async with serving(settings) as first, serving(settings) as second, asyncio.timeout(30):
        async with first.stream("POST", "/v1/chat/completions", json=STREAM) as response:
            job = await next_job(redis)
            worker = asyncio.create_task(slow_worker(redis, job, every_s=0.3))
            seen = await events(response.aiter_lines(), count=2)
        # Two clients resume the same stream (say, two tabs); the second one leaves early.
        staying = asyncio.create_task(
            first.post("/v1/chat/completions", json=STREAM, headers={"Last-Event-ID": seen[-1][0]})
        )
        await until_record(redis, job.id, "resumes", 1)
        leaving = second.stream(
            "POST", "/v1/chat/completions", json=STREAM, headers={"Last-Event-ID": seen[-1][0]}
        )
        async with leaving as early:
            await events(early.aiter_lines(), count=1)
        await until_record(redis, job.id, "readers", 1)
        assert await worker == "stop", "a reader was still there: nothing cancelled the job"
        rest = await events(aiter_lines((await staying).text))
    assert text_of(seen) + text_of(rest) == "".join(WORDS)
    assert rest[-1][1] == "[DONE]"


async def until_record(redis: aioredis.Redis, job_id: str, field: str, count: int) -> None:
    """Until the job's record counts `count` in `field` (readers, resumes)."""

    async def counted() -> bool:
        return int(await redis.hget(keys.job_record(job_id), field) or 0) == count  # type: ignore[misc]

    await eventually(counted, what=f"the job's {field} reaching {count}")


async def test_a_stream_resumes_only_for_the_key_that_sent_its_request(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    alice, bob = api_keys.new_secret(), api_keys.new_secret()
    settings = settings_for(redis_server.url, first_byte_budget_s=0.1)
    settings.auth.keys = [
        ApiKey(name="alice", sha256=api_keys.digest(alice)),
        ApiKey(name="bob", sha256=api_keys.digest(bob)),
    ]
    async with serving(settings) as client, asyncio.timeout(30):
        async with client.stream(
            "POST", "/v1/chat/completions", json=STREAM, headers={"Authorization": f"Bearer {alice}"}
        ) as response:
            job = await next_job(redis)
            worker = asyncio.create_task(slow_worker(redis, job, every_s=0.1))
            seen = await events(response.aiter_lines(), count=2)
        as_bob = await client.post(
            "/v1/chat/completions",
            json=STREAM,
            headers={"Authorization": f"Bearer {bob}", "Last-Event-ID": seen[-1][0]},
        )
        as_alice = await client.post(
            "/v1/chat/completions",
            json=STREAM,
            headers={"Authorization": f"Bearer {alice}", "Last-Event-ID": seen[-1][0]},
        )
        await worker
    assert as_bob.status_code == 404, "another key's answer is not revealed, nor that it exists"
    assert as_bob.json()["error"]["code"] == "stream_not_found"
    assert as_alice.status_code == 200
    assert text_of(seen) + text_of(await events(aiter_lines(as_alice.text))) == "".join(WORDS)


# Hostile callers: a resume is a request like any other (admission, ownership, readers).


def with_key(settings: Settings, name: str, **limits: int) -> str:
    """Add a key called `name` with `limits` (rpm, tpm, max_parallel) to `settings`; its secret."""
    secret = api_keys.new_secret()
    settings.auth.keys = [*settings.auth.keys, ApiKey(name=name, sha256=api_keys.digest(secret), **limits)]
    return secret


def bearer(secret: str, last_event_id: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {secret}"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    return headers


async def abandoned(
    client: httpx.AsyncClient, redis: aioredis.Redis, secret: str, *, body: dict[str, object] = STREAM
) -> tuple[Job, list[tuple[str, str]], asyncio.Task[str]]:
    """A stream sent with `secret` whose client left after two events: its job, what the client saw,
    and the worker still writing it (slowly)."""
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=bearer(secret)) as response:
        assert response.status_code == 200
        job = await next_job(redis)
        worker = asyncio.create_task(slow_worker(redis, job, every_s=0.3))
        seen = await events(response.aiter_lines(), count=2)
    await until_record(redis, job.id, "readers", 0)  # the client's leaving was counted
    return job, seen, worker


async def commands_run(redis: aioredis.Redis) -> set[str]:
    """The Redis commands run since the last CONFIG RESETSTAT (scripts' own commands included)."""
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_").split("|")[0] for name in stats}


async def test_a_resume_is_held_to_its_keys_requests_in_flight(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    """A key limited to one request in flight ran several resumed streams at once."""
    settings = settings_for(redis_server.url, first_byte_budget_s=0.1, resume_grace_s=5.0)
    secret = with_key(settings, "alice", max_parallel=1)
    async with serving(settings) as client, asyncio.timeout(30):
        job, seen, worker = await abandoned(client, redis, secret)
        async with client.stream(
            "POST", "/v1/chat/completions", json=STREAM, headers=bearer(secret, seen[-1][0])
        ) as reading:
            assert reading.status_code == 200
            lines = reading.aiter_lines()  # one iterator: a dropped one would close the response
            first = await events(lines, count=1)
            second = await client.post(
                "/v1/chat/completions", json=STREAM, headers=bearer(secret, seen[-1][0])
            )
            assert second.status_code == 429, second.text
            assert "1 requests in flight" in second.json()["error"]["message"]
            # The refused resume is not a reader of the job, and did not count as a resumption.
            assert await redis.hget(keys.job_record(job.id), "readers") == b"1"  # type: ignore[misc]
            assert await redis.hget(keys.job_record(job.id), "resumes") == b"1"  # type: ignore[misc]
            rest = first + await events(lines)
        await worker
    assert text_of(seen) + text_of(rest) == "".join(WORDS)
    assert not await redis.zcard(keys.key_in_flight(api_keys.digest(secret))), "the resume gave its slot back"


@pytest.mark.parametrize(
    ("limits", "max_tokens", "error_type"),
    [({"rpm": 1}, 3, "requests"), ({"tpm": 600}, 2048, "tokens")],
    ids=["rpm", "tpm"],
)
async def test_a_key_past_its_rate_limit_cannot_resume_and_its_refusal_touches_nothing(
    redis: aioredis.Redis,
    redis_server: PrivateRedis,
    limits: dict[str, int],
    max_tokens: int,
    error_type: str,
) -> None:
    """A key spent by its first request (one request a minute; or 2,048 tokens against 600 a minute)
    resumed its stream over and over, and received the answer many times within the minute."""
    settings = settings_for(redis_server.url, 5.0, first_byte_budget_s=0.1, resume_grace_s=5.0)
    secret = with_key(settings, "alice", **limits)
    body = {**STREAM, "max_tokens": max_tokens}
    async with serving(settings) as client, asyncio.timeout(30):
        job, seen, worker = await abandoned(client, redis, secret, body=body)
        worker.cancel()  # it writes no more: what runs in Redis from now on is the resumes' doing
        await redis.config_resetstat()
        for _ in range(5):
            refused = await client.post(
                "/v1/chat/completions", json=body, headers=bearer(secret, seen[-1][0])
            )
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["type"] == error_type
            assert int(refused.headers["Retry-After"]) >= 1
        ran = await commands_run(redis)
        record = await redis.hgetall(keys.job_record(job.id))  # type: ignore[misc]
    # Nothing but admission ran: no reader counted, no result read, no expiry renewed.
    assert record.get(b"readers") == b"0" and b"resumes" not in record
    assert not ran & {"xrange", "hincrby", "expire"}, ran


@pytest.mark.parametrize(
    ("queued_max_tokens", "resent_max_tokens", "status"),
    [(500, 1, 429), (100, 2048, 200)],
    ids=["not-cheaper", "not-dearer"],
)
async def test_a_resume_reserves_the_answer_of_its_job_as_queued_whatever_body_it_resends(
    redis: aioredis.Redis,
    redis_server: PrivateRedis,
    queued_max_tokens: int,
    resent_max_tokens: int,
    status: int,
) -> None:
    """A resume reserved its re-sent body's max_tokens: lowered to 1, it was let in by a bucket that
    lacked its job's answer (and, leaving early, kept only that 1); raised, it was refused by one
    that held the answer."""
    settings = settings_for(redis_server.url, 5.0, first_byte_budget_s=0.1, resume_grace_s=5.0)
    secret = with_key(settings, "alice", tpm=600)
    async with serving(settings) as client, asyncio.timeout(30):
        queued = {**STREAM, "max_tokens": queued_max_tokens}
        job, seen, worker = await abandoned(client, redis, secret, body=queued)
        resent = {**STREAM, "max_tokens": resent_max_tokens}
        resumed = await client.post("/v1/chat/completions", json=resent, headers=bearer(secret, seen[-1][0]))
        assert resumed.status_code == status, resumed.text
        if status == 429:
            message = resumed.json()["error"]["message"]
            assert f"this request counts about {queued_max_tokens})" in message
        else:
            assert text_of(seen) + text_of(await events(aiter_lines(resumed.text))) == "".join(WORDS)
        await worker
    assert (
        await redis.hget(keys.job_record(job.id), keys.ANSWER_TOKENS_FIELD) == str(queued_max_tokens).encode()
    )


async def test_several_readers_of_one_job_on_one_front_door_each_get_the_whole_rest(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    """Three readers resuming one job through one front door: one got the answer, two hung."""
    settings = settings_for(redis_server.url, 5.0, first_byte_budget_s=0.1, resume_grace_s=5.0)
    async with serving(settings) as client, asyncio.timeout(30):
        async with client.stream("POST", "/v1/chat/completions", json=STREAM) as response:
            job = await next_job(redis)
            worker = asyncio.create_task(slow_worker(redis, job, every_s=0.2))
            seen = await events(response.aiter_lines(), count=3)
        # Each resumes where it was: one after the first event, two after the third.
        points = [seen[0][0], seen[2][0], seen[2][0]]
        readers = [
            asyncio.create_task(
                client.post("/v1/chat/completions", json=STREAM, headers={"Last-Event-ID": point})
            )
            for point in points
        ]
        answers = await asyncio.gather(*readers)
        assert await worker == "stop"
    for answer, had in zip(answers, [seen[:1], seen, seen], strict=True):
        assert answer.status_code == 200
        rest = await events(aiter_lines(answer.text))
        assert text_of(had) + text_of(rest) == "".join(WORDS)
        assert rest[-1][1] == "[DONE]"


async def test_a_resume_refused_as_another_keys_job_is_no_reader_of_it(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    """Bob's refused resume of Alice's job counted as a reader: her abandoned job ran to its end."""
    settings = settings_for(redis_server.url, first_byte_budget_s=0.1, resume_grace_s=0.5)
    alice, bob = with_key(settings, "alice"), with_key(settings, "bob")
    async with serving(settings) as client, asyncio.timeout(30):
        _, seen, worker = await abandoned(client, redis, alice)
        as_bob = await client.post("/v1/chat/completions", json=STREAM, headers=bearer(bob, seen[-1][0]))
        assert as_bob.status_code == 404
        assert as_bob.json()["error"]["code"] == "stream_not_found"
        assert await worker == "abort", "nobody read Alice's job: it was cancelled after its grace"


async def test_a_job_belongs_to_its_keys_identity_not_its_name(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    """A key stored under the name `admin` (as `switchboard keys add admin` used to allow) replayed the
    admin key's streams."""
    settings = settings_for(redis_server.url, first_byte_budget_s=0.1, resume_grace_s=5.0)
    admin = api_keys.new_secret()
    settings.auth.admin_key_sha256 = api_keys.digest(admin)
    impostor = api_keys.new_secret()
    record = ApiKey(name="admin", sha256=api_keys.digest(impostor))
    await redis.hset(keys.api_keys(), record.sha256, api_keys.encode_record(record))  # type: ignore[misc]
    async with serving(settings) as client, asyncio.timeout(30):
        _, seen, worker = await abandoned(client, redis, admin)
        replay = await client.post("/v1/chat/completions", json=STREAM, headers=bearer(impostor, seen[-1][0]))
        assert replay.status_code == 404, "same name, another key: not its job"
        as_admin = await client.post("/v1/chat/completions", json=STREAM, headers=bearer(admin, seen[-1][0]))
        await worker
    assert as_admin.status_code == 200
    assert text_of(seen) + text_of(await events(aiter_lines(as_admin.text))) == "".join(WORDS)


async def test_a_last_event_id_out_of_range_or_naming_no_event_is_a_400_in_our_words(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with (
        serving(settings_for(redis_server.url, first_byte_budget_s=0.1)) as client,
        asyncio.timeout(30),
    ):
        async with client.stream("POST", "/v1/chat/completions", json=STREAM) as response:
            job = await next_job(redis)
            await slow_worker(redis, job, every_s=0)
            await events(response.aiter_lines())
        answers = {
            point: await client.post("/v1/chat/completions", json=STREAM, headers={"Last-Event-ID": point})
            for point in [f"{job.id}:{'9' * 25}-0", f"{job.id}:0-{'9' * 25}", f"{job.id}:1-1"]
        }
        await redis.delete(keys.result_stream(job.id))
        gone = await client.post(
            "/v1/chat/completions", json=STREAM, headers={"Last-Event-ID": f"{job.id}:1-1"}
        )
    for point, answer in answers.items():
        assert answer.status_code == 400, (point, answer.text)
        error = answer.json()["error"]
        assert error["code"] == "invalid_last_event_id"
        assert "Last-Event-ID" in error["message"]
        for redis_words in ("ERR", "script", "f_", "Invalid stream ID"):
            assert redis_words not in error["message"], error["message"]
    assert gone.status_code == 404
    assert gone.json()["error"]["code"] == "stream_not_found"


async def test_an_abandoned_stream_is_trimmed_once_its_grace_passes(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    """An abandoned stream kept its results (~170 KB for a long answer) for RESULT_TTL_S."""
    settings = settings_for(redis_server.url, first_byte_budget_s=0.1, resume_grace_s=0.5)
    secret = with_key(settings, "alice")
    async with serving(settings) as client, asyncio.timeout(30):
        job, _, worker = await abandoned(client, redis, secret)
        worker.cancel()  # nothing writes a chunk after the client left
        assert await redis.exists(keys.result_stream(job.id), keys.job_record(job.id)) == 2
        for _ in range(250):  # past the grace: given up at once, not kept for RESULT_TTL_S
            if await redis.exists(keys.cancel_mark(job.id)):
                break
            await asyncio.sleep(0.02)
        assert await redis.exists(keys.cancel_mark(job.id))
        assert not await redis.exists(keys.result_stream(job.id), keys.job_record(job.id))


# A client that asks for nothing: OpenAI's shape, and it resumes by counting events.


async def test_any_client_resumes_by_counting_events_through_another_front_door(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    """The stock `openai` client: no `id:` lines; it resumes with `<x-request-id>:<events it had>`,
    and gets the rest in the same shape, the usage event included; then resumes that one the same way."""
    first_settings = settings_for(redis_server.url, first_byte_budget_s=0.1, resume_grace_s=5.0)
    second_settings = settings_for(redis_server.url, first_byte_budget_s=0.1)
    body = {"messages": STREAM["messages"], "stream_options": {"include_usage": True}}
    async with (
        plain_serving(first_settings) as first,
        plain_serving(second_settings) as second,
        asyncio.timeout(30),
    ):
        sdk = AsyncOpenAI(base_url=f"{first.base_url}/v1", api_key="unused", max_retries=0)
        stream = await sdk.chat.completions.create(model=MODEL, stream=True, **body)
        job = await next_job(redis)
        worker = asyncio.create_task(slow_worker(redis, job))
        request_id = stream.response.headers["x-request-id"]
        had = [chunk async for chunk in limited(stream, 3)]
        await stream.close()  # the connection broke after three events
        assert request_id == job.id

        elsewhere = AsyncOpenAI(base_url=f"{second.base_url}/v1", api_key="unused", max_retries=0)
        again = await elsewhere.chat.completions.create(
            model=MODEL, stream=True, extra_headers={"Last-Event-ID": f"{request_id}:3"}, **body
        )
        assert again.response.headers["x-request-id"] == job.id
        more = [chunk async for chunk in limited(again, 2)]
        await again.close()  # and broke again, two events later
        last = await elsewhere.chat.completions.create(
            model=MODEL, stream=True, extra_headers={"Last-Event-ID": f"{request_id}:5"}, **body
        )
        rest = [chunk async for chunk in last]
        assert await worker == "stop"
    chunks = had + more + rest
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "".join(WORDS)
    assert [c.choices[0].delta.role for c in chunks[:2]] == ["assistant", None], "the role once"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    assert {c.id for c in chunks} == {f"chatcmpl-{job.id}"}
    assert await redis.xlen(keys.job_stream(MODEL)) == 1  # no second job


async def test_a_counted_resume_is_in_openais_shape_and_past_the_end_gets_only_the_end(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with (
        plain_serving(settings_for(redis_server.url, first_byte_budget_s=0.1)) as client,
        asyncio.timeout(30),
    ):
        async with client.stream("POST", "/v1/chat/completions", json=STREAM) as response:
            job = await next_job(redis)
            await slow_worker(redis, job, every_s=0)
            whole = (await response.aread()).decode()
        resumed = await client.post(
            "/v1/chat/completions", json=STREAM, headers={"Last-Event-ID": f"{job.id}:4"}
        )
        past_the_end = await client.post(
            "/v1/chat/completions", json=STREAM, headers={"Last-Event-ID": f"{job.id}:99"}
        )
    events_of = [e.strip("\n") for e in whole.split("\n\n") if e.strip()]  # keep-alives left out
    assert all(e.startswith("data: ") for e in events_of), "no `id:` lines"
    assert resumed.status_code == 200, resumed.text
    assert resumed.text == "\n\n".join(events_of[4:]) + "\n\n", "byte for byte the rest"
    assert past_the_end.text == "data: [DONE]\n\n"


async def limited(stream: AsyncIterator[Any], count: int) -> AsyncIterator[Any]:
    """The first `count` items of `stream`."""
    taken = 0
    async for item in stream:
        yield item
        taken += 1
        if taken == count:
            return
