"""A front door without API keys on loopback answers this machine's names and pages only.

Real app, real port, httpx: a DNS-rebinding page (its own host name in `Host`), another site's
form or script (its `Origin`), and an admin POST that is not JSON are refused; this machine's own
callers are not, and with a key none of the host checks apply.
"""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from router.http.local_pages import is_local_name
from switchboard import api_keys
from switchboard.config import ApiKey
from switchboard.local.redis_server import PrivateRedis
from tests.support.front_door_harness import MODEL, serving, settings_for

LOAD = f"/admin/models/{MODEL}/load"


@pytest.mark.parametrize(
    ("name", "local"),
    [
        ("localhost", True),
        ("app.localhost", True),
        ("127.0.0.1", True),
        ("127.9.9.9", True),
        ("::1", True),
        ("LOCALHOST.", True),
        ("evil.example", False),
        ("localhost.evil.example", False),
        ("0.0.0.0", False),
        ("192.168.1.5", False),
        ("", False),
        (None, False),
    ],
)
def test_local_names(name: str | None, local: bool) -> None:
    assert is_local_name(name.lower() if name else name, []) is local


def test_an_allowed_host_is_local() -> None:
    assert is_local_name("box.lan", ["Box.LAN"])


async def test_a_rebinding_page_or_another_sites_form_cannot_load_a_model(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(settings_for(redis_server.url)) as client:
        # DNS rebinding: the page's own name, re-pointed at 127.0.0.1, is in Host.
        rebound = await client.post(LOAD, json={}, headers={"Host": "evil.example:8000"})
        assert rebound.status_code == 403
        assert rebound.json()["error"]["code"] == "host_not_allowed"
        assert (await client.get("/v1/models", headers={"Host": "evil.example"})).status_code == 403
        assert (await client.get("/readyz", headers={"Host": "evil.example"})).status_code == 403
        # A cross-site form: a simple content type, and the page's Origin.
        form = await client.post(
            LOAD, content=b"x=1", headers={"Content-Type": "application/x-www-form-urlencoded"}
        )
        assert form.status_code == 415
        from_page = await client.post(LOAD, json={}, headers={"Origin": "https://evil.example"})
        assert from_page.status_code == 403
        assert from_page.json()["error"]["code"] == "origin_not_allowed"
        sandboxed = await client.post(LOAD, json={}, headers={"Origin": "null"})
        assert sandboxed.status_code == 403
        assert not await redis.keys("*desired*"), "nothing was asked of the workers"
        # This machine's own callers, and its own pages.
        assert (await client.post(LOAD, json={})).status_code == 202
        local_page = await client.post(LOAD, json={}, headers={"Origin": "http://localhost:3000"})
        assert local_page.status_code == 202
        named = await client.get("/v1/models", headers={"Host": "localhost:8000"})
        assert named.status_code == 200


async def test_an_admin_post_without_a_json_type_is_a_415(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(settings_for(redis_server.url)) as client:
        for headers in (
            {},
            {"Content-Type": "text/plain"},
            {"Content-Type": "multipart/form-data; boundary=x"},
        ):
            refused = await client.post(LOAD, headers=headers)
            assert refused.status_code == 415
            assert refused.json()["error"]["code"] == "unsupported_media_type"


async def test_allowed_hosts_are_answered(redis: aioredis.Redis, redis_server: PrivateRedis) -> None:
    settings = settings_for(redis_server.url)
    settings.router.allowed_hosts = ["switchboard.lan"]
    async with serving(settings) as client:
        named = await client.get("/v1/models", headers={"Host": "switchboard.lan:8000"})
        assert named.status_code == 200
        page = await client.get("/v1/models", headers={"Origin": "http://switchboard.lan:8000"})
        assert page.status_code == 200


async def test_with_a_key_the_host_is_not_checked(redis: aioredis.Redis, redis_server: PrivateRedis) -> None:
    secret = api_keys.new_secret()
    settings = settings_for(redis_server.url)
    settings.auth.keys = [ApiKey(name="ops", sha256=api_keys.digest(secret), admin=True)]
    async with serving(settings) as client:
        keyed = {"Authorization": f"Bearer {secret}", "Host": "box.example"}
        assert (await client.get("/v1/models", headers=keyed)).status_code == 200
        assert (await client.get("/v1/models", headers={"Host": "box.example"})).status_code == 401
