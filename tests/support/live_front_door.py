"""A live front door for property tests: the app and a worker that answers every job, in a thread.

Hypothesis tests are synchronous, so the server, its Redis clients and the scripted worker run on an
event loop of their own in a background thread, and tests talk to them over a real port with a
synchronous client. Bodies are written as raw JSON text, so that they can carry what Python's values
cannot (`1e999`, invalid UTF-8, lone surrogates), and every answer is checked for OpenAI's shapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
from collections.abc import AsyncIterator
from typing import Any, cast

import httpx
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from switchboard import keys
from switchboard.config import ModelConfig
from switchboard.tasks import cancel_and_wait
from switchboard.wire import TIERS, Chunk, Job, ModelLimits, Usage, encode, job_decoder
from tests.support.front_door_harness import MODEL, serving, settings_for, write_chunks

# `MODEL` has published limits; `UNMEASURED` has none yet (no worker has loaded it).
UNMEASURED = "unmeasured"
LIMITS = ModelLimits(max_model_len=2048, vocab_size=1000, max_token_chars=16)
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
ANSWER = "x"
GOOD: dict[str, dict[str, Any]] = {
    CHAT: {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3},
    COMPLETIONS: {"model": MODEL, "prompt": "Hi", "max_tokens": 3},
}
# Error text must speak of the request, never of the code that read it.
PYTHON_INTERNALS = re.compile(r"Traceback|File \"|\b[A-Z]\w*(Error|Exception)\b|\bmsgspec\b|\blitestar\b")


def answer(job: Job) -> list[Chunk]:
    """`ANSWER` for every choice of `job`; the last chunk carries the usage, as a worker's does."""
    choices = job.sampling.n * (len(job.prompts) if job.prompts is not None else 1)
    chunks = [Chunk(text=ANSWER, index=index, finish_reason="stop") for index in range(choices)]
    usage = Usage(prompt_tokens=1, completion_tokens=choices)
    chunks[-1] = Chunk(text=ANSWER, index=choices - 1, finish_reason="stop", usage=usage)
    return chunks


# What XREADGROUP answers: per stream, its entries' ids and fields.
StreamEntries = list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]] | None


@contextlib.asynccontextmanager
async def answering_every_job(redis: aioredis.Redis) -> AsyncIterator[None]:
    """Take the jobs of both models, every tier, with the real consumer group and answer each at once."""
    models = (MODEL, UNMEASURED)
    streams: dict[Any, Any] = {stream: ">" for model in models for stream in keys.job_streams(model, TIERS)}
    for stream in streams:
        with contextlib.suppress(ResponseError):
            await redis.xgroup_create(stream, keys.JOB_GROUP, id="0", mkstream=True)

    async def loop() -> None:
        while True:
            response = cast(
                StreamEntries, await redis.xreadgroup(keys.JOB_GROUP, "hostile", streams, block=100)
            )
            for stream, entries in response or ():
                for entry_id, fields in entries:
                    job = job_decoder.decode(fields[b"job"])
                    await write_chunks(redis, job.id, *answer(job))
                    # As a worker does: acknowledged and deleted, so the queue's depth stays true.
                    await redis.xack(stream, keys.JOB_GROUP, entry_id)
                    await redis.xdel(stream, entry_id)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        # Cancelled until it ends: a blocked XREADGROUP can lose one cancellation (redis-py on 3.11).
        await cancel_and_wait(task)


class LiveFrontDoor:
    """The front door and a worker that answers every job, on an event loop of their own."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self.base_url = ""
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="hostile-front-door", daemon=True)

    def __enter__(self) -> LiveFrontDoor:
        self._thread.start()
        if not self._ready.wait(timeout=30) or not self.base_url:
            raise RuntimeError("the front door did not start") from self._failure
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=60)
        if self._thread.is_alive():
            # Its Redis client would go on touching the next test's keys.
            raise RuntimeError("the front door's thread did not stop within 60 s")

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:
            self._failure = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        models = [ModelConfig(name=name, path="/nonexistent") for name in (MODEL, UNMEASURED)]
        redis = aioredis.Redis.from_url(self.redis_url)
        try:
            await redis.flushdb()
            await redis.set(keys.model_limits(MODEL), encode(LIMITS))
            settings = settings_for(self.redis_url, 10.0, models=models)
            async with serving(settings) as client, answering_every_job(redis):
                self.base_url = str(client.base_url)
                self._ready.set()
                await self._stop.wait()
        finally:
            # No flush here: were this thread late, it would wipe the next test's keys. The next
            # test's `redis` fixture empties the database before it starts.
            await redis.aclose()


# --- bodies, and what must come back -------------------------------------------------------------


class Raw(bytes):
    """JSON text written as is: numbers Python cannot hold (`1e999`), escapes, invalid UTF-8."""


def to_json(value: Any) -> bytes:
    """`value` as JSON text; a `Raw` inside it is written verbatim, a lone surrogate as its bytes."""
    if isinstance(value, Raw):
        return bytes(value)
    if isinstance(value, dict):
        return b"{" + b",".join(to_json(str(k)) + b":" + to_json(v) for k, v in value.items()) + b"}"
    if isinstance(value, list):
        return b"[" + b",".join(to_json(item) for item in value) + b"]"
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


def post(
    client: httpx.Client, path: str, body: Any, content_type: str | None = "application/json"
) -> httpx.Response:
    """POST `body` (bytes as they are, anything else as JSON) with `content_type`, if any."""
    content = body if isinstance(body, bytes) else to_json(body)
    # Latin-1, as HTTP carries header bytes beyond ASCII.
    headers = {} if content_type is None else {b"content-type": content_type.encode("latin-1")}
    return client.post(path, content=content, headers=headers)


def error_of(response: httpx.Response, status: int | None = None) -> dict[str, Any]:
    """The response's OpenAI error object, checked for shape; it must be a 4xx."""
    assert 400 <= response.status_code < 500, f"{response.status_code}: {response.text[:1000]}"
    if status is not None:
        assert response.status_code == status, response.text[:1000]
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert list(body) == ["error"], body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"].strip(), error
    assert error["type"] == "invalid_request_error", error
    assert error["param"] is None or isinstance(error["param"], str), error
    assert error["code"] is None or isinstance(error["code"], str), error
    assert not PYTHON_INTERNALS.search(error["message"]), error
    return dict(error)


def assert_answered(response: httpx.Response, path: str, choices: int | None = None) -> None:
    """A 200 carrying the scripted worker's answer, whole or streamed."""
    assert response.status_code == 200, f"{response.status_code}: {response.text[:1000]}"
    kind = "chat.completion" if path == CHAT else "text_completion"
    if response.headers["content-type"].startswith("text/event-stream"):
        # OpenAI's shape: `data:` events only (keep-alives are blank lines).
        events = [e.strip("\n") for e in response.text.split("\n\n") if e.strip()]
        assert all(e.startswith("data: ") and "\n" not in e for e in events), events
        assert events[-1] == "data: [DONE]", events
        payloads = [json.loads(event.removeprefix("data: ")) for event in events[:-1]]
        assert payloads and all(
            p["object"] == kind.replace(".completion", ".completion.chunk") for p in payloads
        )
        return
    body = response.json()
    assert body["object"] == kind, body
    assert body["usage"]["total_tokens"] > 0
    assert body["choices"] and (choices is None or len(body["choices"]) == choices), body
    for choice in body["choices"]:
        if path == CHAT:
            assert choice["message"]["content"] == ANSWER or choice["message"]["tool_calls"], choice
        else:
            assert choice["text"] == ANSWER, choice
