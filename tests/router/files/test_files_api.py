"""OpenAI's Files API on a real front door (HTTP server, Redis, a local file store) with the official
`openai` client: a batch file's upload checked line by line, its owner's alone to list, read and
delete, and swept away at its expiry; a batch and its output are its key's alone too."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
import redis.asyncio as aioredis

from router.files.records import FileRecords
from switchboard import keys
from switchboard.config import ApiKey, ModelConfig, Settings
from switchboard.local.redis_server import PrivateRedis
from tests.support.front_door_harness import front_door_of, serving, settings_for
from tests.support.live_front_door import answering_every_job

MODEL = "tiny"
EMBEDDER = "emb"
SECRETS = {"alice": "sk-alice-0123456789", "bob": "sk-bob-0123456789", "narrow": "sk-narrow-0123456789"}


def chat_line(custom_id: str, model: str = MODEL, **body: Any) -> dict[str, Any]:
    payload = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": payload}


def embed_line(custom_id: str) -> dict[str, Any]:
    body = {"model": EMBEDDER, "input": "a text"}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}


def jsonl(*lines: dict[str, Any] | str) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()


GOOD = jsonl(chat_line("a"), chat_line("b", temperature=0), embed_line("c"))


@pytest.fixture
def settings(redis: aioredis.Redis, redis_server: PrivateRedis, tmp_path: Path) -> Settings:
    # `redis`: the session's Redis, emptied for each test.
    models = [
        ModelConfig(name=MODEL, path="/nonexistent"),
        ModelConfig(name=EMBEDDER, path="/e", kind="embed"),
    ]
    settings = settings_for(redis_server.url, models=models)
    settings.files.store = str(tmp_path / "files")
    settings.files.max_file_bytes = 64 * 1024
    settings.auth.keys = [
        ApiKey(
            name=name,
            sha256=hashlib.sha256(secret.encode()).hexdigest(),
            models=[] if name != "narrow" else [EMBEDDER],
        )
        for name, secret in SECRETS.items()
    ]
    return settings


@pytest.fixture
async def clients(settings: Settings) -> AsyncIterator[dict[str, openai.AsyncOpenAI]]:
    async with serving(settings) as http:
        clients = {
            name: openai.AsyncOpenAI(base_url=f"{http.base_url}/v1", api_key=secret, max_retries=0)
            for name, secret in SECRETS.items()
        }
        yield clients
        for client in clients.values():
            await client.close()


async def test_a_batch_file_is_uploaded_listed_read_and_deleted_by_its_owner(
    clients: dict[str, openai.AsyncOpenAI],
) -> None:
    alice = clients["alice"]
    before = time.time()
    uploaded = await alice.files.create(file=("batch.jsonl", GOOD), purpose="batch")
    assert (uploaded.purpose, uploaded.filename, uploaded.bytes, uploaded.status) == (
        "batch",
        "batch.jsonl",
        len(GOOD),
        "processed",
    )
    assert uploaded.id.startswith("file-") and before - 1 <= uploaded.created_at <= time.time() + 1
    assert uploaded.expires_at is not None and uploaded.expires_at - uploaded.created_at == pytest.approx(
        30 * 86400, abs=2
    )

    assert [f.id for f in (await alice.files.list()).data] == [uploaded.id]
    assert (await alice.files.retrieve(uploaded.id)).bytes == len(GOOD)
    assert (await alice.files.content(uploaded.id)).content == GOOD

    assert (await alice.files.delete(uploaded.id)).deleted is True
    with pytest.raises(openai.NotFoundError):
        await alice.files.retrieve(uploaded.id)
    assert (await alice.files.list()).data == []


async def test_another_key_can_neither_see_read_nor_delete_a_file(
    clients: dict[str, openai.AsyncOpenAI],
) -> None:
    uploaded = await clients["alice"].files.create(file=("mine.jsonl", GOOD), purpose="batch")
    bob = clients["bob"]
    assert (await bob.files.list()).data == []
    for attempt in (bob.files.retrieve, bob.files.content, bob.files.delete):
        with pytest.raises(openai.NotFoundError) as caught:
            await attempt(uploaded.id)
        assert caught.value.body["code"] == "file_not_found"  # type: ignore[index]
    assert (await clients["alice"].files.content(uploaded.id)).content == GOOD


async def test_another_key_can_neither_see_cancel_nor_download_a_batch(
    clients: dict[str, openai.AsyncOpenAI], redis: aioredis.Redis
) -> None:
    alice, bob = clients["alice"], clients["bob"]
    uploaded = await alice.files.create(
        file=("in.jsonl", jsonl(chat_line("a"), chat_line("b"))), purpose="batch"
    )
    with pytest.raises(openai.NotFoundError):  # nor use another key's file as a batch's input
        await bob.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    async with answering_every_job(redis):
        batch = await alice.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        for _ in range(200):
            batch = await alice.batches.retrieve(batch.id)
            if batch.status == "completed":
                break
            await asyncio.sleep(0.1)
    assert batch.status == "completed" and batch.output_file_id is not None
    assert [seen.id for seen in (await bob.batches.list()).data] == []
    for attempt in (bob.batches.retrieve, bob.batches.cancel):
        with pytest.raises(openai.NotFoundError):
            await attempt(batch.id)
    with pytest.raises(openai.NotFoundError):
        await bob.files.content(batch.output_file_id)
    assert (await alice.batches.retrieve(batch.id)).status == "completed"  # bob's cancel changed nothing
    assert len((await alice.files.content(batch.output_file_id)).text.splitlines()) == 2


async def test_pages_and_expiry_as_the_upload_asks(clients: dict[str, openai.AsyncOpenAI]) -> None:
    alice = clients["alice"]
    ids = [(await alice.files.create(file=(f"{n}.jsonl", GOOD), purpose="batch")).id for n in range(3)]
    first = await alice.files.list(limit=2)
    assert [f.id for f in first.data] == ids[::-1][:2] and first.has_more
    rest = await alice.files.list(limit=2, after=first.data[-1].id)
    assert [f.id for f in rest.data] == [ids[0]] and not rest.has_more
    assert [f.id for f in (await alice.files.list(order="asc")).data] == ids
    short = await alice.files.create(
        file=("short.jsonl", GOOD), purpose="batch", expires_after={"anchor": "created_at", "seconds": 3600}
    )
    assert short.expires_at is not None and short.expires_at - short.created_at == pytest.approx(3600, abs=2)


@pytest.mark.parametrize(
    ("content", "code", "says"),
    [
        (jsonl(chat_line("a"), "{not json"), "invalid_json_line", "line 2"),
        (jsonl(chat_line("a"), chat_line("a")), "duplicate_custom_id", "line 2"),
        (jsonl({**chat_line("a"), "method": "GET"}), "invalid_method", "line 1"),
        (jsonl({**chat_line("a"), "url": "/v1/images"}), "invalid_url", "line 1"),
        (jsonl(chat_line("a", model="nope")), "model_not_found", "nope"),
        (jsonl(chat_line("a", stream=True)), "invalid_request", "stream"),
        (
            jsonl({**chat_line("a"), "body": {"model": MODEL, "messages": []}}),
            "invalid_value",
            "body.messages",
        ),
        (jsonl({**embed_line("e"), "url": "/v1/chat/completions"}), "invalid_request", "line 1"),
        (b"\n\n", "empty_file", "no requests"),
    ],
)
async def test_a_file_with_a_bad_line_is_refused_naming_it(
    clients: dict[str, openai.AsyncOpenAI], content: bytes, code: str, says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await clients["alice"].files.create(file=("bad.jsonl", content), purpose="batch")
    body: dict[str, Any] = caught.value.body  # type: ignore[assignment]
    assert body["param"] == "file" and says in body["message"], body
    if code != "invalid_request":
        assert body["code"] == code, body
    assert (await clients["alice"].files.list()).data == []


async def test_a_line_naming_a_model_the_key_may_not_use_is_refused(
    clients: dict[str, openai.AsyncOpenAI],
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await clients["narrow"].files.create(file=("in.jsonl", jsonl(chat_line("a"))), purpose="batch")
    assert caught.value.body["code"] == "model_not_found"  # type: ignore[index]
    narrow = await clients["narrow"].files.create(file=("in.jsonl", jsonl(embed_line("e"))), purpose="batch")
    assert narrow.bytes > 0


async def test_what_is_no_batch_file_is_refused(clients: dict[str, openai.AsyncOpenAI]) -> None:
    alice = clients["alice"]
    cases = [
        ({"file": ("in.txt", GOOD), "purpose": "batch"}, 400, "file"),
        ({"file": ("in.jsonl", GOOD), "purpose": "fine-tune"}, 400, "purpose"),
        ({"file": ("big.jsonl", GOOD * 1000), "purpose": "batch"}, 413, None),
    ]
    for fields, status, param in cases:
        with pytest.raises(openai.APIStatusError) as caught:
            await alice.files.create(**fields)  # type: ignore[arg-type]
        assert caught.value.status_code == status, caught.value.body
        if param is not None:
            assert caught.value.body["param"] == param  # type: ignore[index]
    assert (await alice.files.list()).data == []


async def test_the_sweep_deletes_files_whose_expiry_has_come(settings: Settings) -> None:
    async with (
        serving(settings) as http,
        openai.AsyncOpenAI(base_url=f"{http.base_url}/v1", api_key=SECRETS["alice"], max_retries=0) as alice,
    ):
        kept = await alice.files.create(file=("kept.jsonl", GOOD), purpose="batch")
        due = await alice.files.create(file=("due.jsonl", GOOD), purpose="batch")
        async with front_door_of(settings) as door:
            await door.redis.zadd(keys.files_expiring(), {due.id: time.time() - 1})
            await door.files.sweep()
            assert await FileRecords(door.redis).get(due.id) is None
        assert [f.id for f in (await alice.files.list()).data] == [kept.id]
        with pytest.raises(openai.NotFoundError):
            await alice.files.content(due.id)
    assert os.listdir(settings.files.store) == [kept.id]
