"""Each API key's jobs carry a prefix-cache salt of their own, at a real front door with real Redis:
two keys sending the same prompt never share an engine's cached prefixes (one could otherwise time
the other's prompts), one key's requests do; a client's own `cache_salt` follows its key's, never
replaces it; and with keys off every job shares the one cache.
"""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
import redis.asyncio as aioredis

from switchboard.config import ApiKey
from switchboard.local.redis_server import PrivateRedis
from tests.support.front_door_harness import MODEL, serving, settings_for
from tests.support.scripted_models import Served, models_answering


def key(name: str) -> ApiKey:
    return ApiKey(name=name, sha256=hashlib.sha256(f"sb-{name}".encode()).hexdigest())


async def salts_of(
    client: httpx.AsyncClient, served: Served, *asks: tuple[str | None, str | None]
) -> list[Any]:
    """The cache salt of the job each (key name, client salt) made, in order, as a worker took it."""
    for name, client_salt in asks:
        body: dict[str, Any] = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 1,
        }
        if client_salt is not None:
            body["cache_salt"] = client_salt
        headers = {"authorization": f"Bearer sb-{name}"} if name else {}
        answer = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert answer.status_code == 200, answer.text
    taken = served.of(MODEL)[-len(asks) :]
    return [job.cache_salt for job in taken]


async def test_each_keys_jobs_carry_their_own_cache_salt_and_a_clients_only_follows_it(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    settings = settings_for(redis_server.url)
    settings.auth.keys = [key("alice"), key("bob")]
    async with models_answering(redis, [MODEL]) as served, serving(settings) as client:
        alice, alice_again, bob, alice_own = await salts_of(
            client, served, ("alice", None), ("alice", None), ("bob", None), ("alice", "mine")
        )
        [bob_forging] = await salts_of(client, served, ("bob", alice))
    assert alice and alice == alice_again and bob and bob != alice
    assert alice_own == f"{alice}:mine"
    assert not bob_forging.startswith(alice)


async def test_with_keys_off_every_job_shares_the_cache_and_a_bad_salt_is_a_400(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    async with models_answering(redis, [MODEL]) as served, serving(settings_for(redis_server.url)) as client:
        assert await salts_of(client, served, (None, None), (None, "mine")) == [None, "mine"]
        # A salt vLLM would refuse is the client's 400, naming the field.
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "cache_salt": "a/b"}
        refused = await client.post("/v1/chat/completions", json=body)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "cache_salt", refused.text
