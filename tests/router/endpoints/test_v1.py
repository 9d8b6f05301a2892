"""The OpenAI endpoints name only the models the caller's key may use, even in a 404."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from switchboard import api_keys
from switchboard.config import ApiKey, ModelConfig
from switchboard.local.redis_server import PrivateRedis
from tests.support.front_door_harness import BODY, MODEL, serving, settings_for

OTHER = "secret-project"
MODELS = [ModelConfig(name=MODEL, path="/nonexistent"), ModelConfig(name=OTHER, path="/nonexistent")]
USER_SECRET = api_keys.new_secret()


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/chat/completions", {**BODY, "model": "nope"}),
        ("POST", "/v1/completions", {"model": "nope", "prompt": "Hi"}),
        ("GET", "/v1/models/nope", None),
    ],
)
async def test_a_missing_model_lists_only_the_models_of_the_callers_key(
    redis: aioredis.Redis, redis_server: PrivateRedis, method: str, path: str, body: object
) -> None:
    settings = settings_for(redis_server.url, models=MODELS)
    settings.auth.keys = [ApiKey(name="user", sha256=api_keys.digest(USER_SECRET), models=[MODEL])]
    async with serving(settings) as client:
        response = await client.request(
            method, path, json=body, headers={"Authorization": f"Bearer {USER_SECRET}"}
        )
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found"
    assert error["message"] == f"The model `nope` does not exist. Models you may use here: {MODEL}."
    assert OTHER not in response.text
