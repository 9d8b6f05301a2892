"""Every endpoint that takes a body passes one gate, so the next endpoint cannot forget the bounds.

The application's routes are enumerated: each that takes a body (POST, PUT, PATCH) must declare a
gate, and, on the real front door, must answer what only a gate answers (a body that is not JSON: a
415; JSON that is not its request type: a 400 naming `invalid_json` or the field). A handler that
reads its body any other way fails: the app's request class refuses the read.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from litestar import Litestar, Request, post
from litestar.handlers import HTTPRouteHandler
from litestar.routes import HTTPRoute
from litestar.testing import TestClient

from router.app import create_app
from router.gate import GatedRequest, gate_of
from router.gate.admin import ADMIN_MAX_BODY_BYTES
from router.gate.upload import UploadGate
from switchboard.local.redis_server import PrivateRedis
from tests.support.front_door_harness import serving, settings_for

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# A value for each kind of path parameter the routes have.
_PARAMETER = re.compile(r"\{(\w+)(?::(\w+))?\}")
_SAMPLE = {"path": "tiny/load", "str": "r"}


def body_routes(app: Litestar) -> Iterator[tuple[str, str, HTTPRouteHandler]]:
    """(method, path, handler) of every route of `app` that takes a body."""
    for route in app.routes:
        if isinstance(route, HTTPRoute):
            for handler in route.route_handlers:
                for method in sorted(handler.http_methods & BODY_METHODS):
                    yield method, route.path, handler


def concrete(path: str) -> str:
    return _PARAMETER.sub(lambda match: _SAMPLE[match.group(2) or "str"], path)


@pytest.fixture(scope="module")
def app() -> Litestar:
    return create_app(settings_for("redis://127.0.0.1:1/0"))


def test_every_route_that_takes_a_body_declares_its_gate(app: Litestar) -> None:
    routes = list(body_routes(app))
    paths = {path for _, path, _ in routes}
    # The enumeration finds the endpoints it must (it is not vacuous).
    assert {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/rerank",
        "/v1/files",
    } <= paths
    assert any(path.startswith("/admin/") for path in paths)
    ungated = [f"{method} {path}" for method, path, handler in routes if gate_of(handler) is None]
    assert not ungated, f"these routes take a body without declaring a gate (router.gate): {ungated}"


@pytest.fixture
async def front_door(redis_server: PrivateRedis) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(settings_for(redis_server.url, timeout_s=3.0)) as client:
        yield client


def _routes(*, uploads: bool = False) -> list[tuple[str, str]]:
    """The JSON doors, or (`uploads`) the doors that take a multipart upload."""
    app = create_app(settings_for("redis://127.0.0.1:1/0"))
    return [
        (method, concrete(path))
        for method, path, handler in body_routes(app)
        if isinstance(gate_of(handler), UploadGate) == uploads
    ]


@pytest.mark.parametrize(("method", "path"), _routes())
async def test_every_body_is_read_through_its_gate(
    front_door: httpx.AsyncClient, method: str, path: str
) -> None:
    text = await front_door.request(method, path, content=b"{}", headers={"content-type": "text/plain"})
    assert text.status_code == 415, text.text
    assert text.json()["error"]["code"] == "unsupported_media_type"
    broken = await front_door.request(
        method, path, content=b"{", headers={"content-type": "application/json"}
    )
    assert broken.status_code == 400, broken.text
    assert broken.json()["error"]["type"] == "invalid_request_error"
    wrong_type = await front_door.request(
        method, path, content=b"[1]", headers={"content-type": "application/json"}
    )
    assert wrong_type.status_code == 400, wrong_type.text


@pytest.mark.parametrize(("method", "path"), _routes(uploads=True))
async def test_every_upload_is_read_through_its_gate(
    front_door: httpx.AsyncClient, method: str, path: str
) -> None:
    """An upload door (`/v1/files`) takes multipart only: JSON and text are a 415 before anything is read."""
    for media_type in ("text/plain", "application/json"):
        answer = await front_door.request(method, path, content=b"{}", headers={"content-type": media_type})
        assert answer.status_code == 415, answer.text
        assert answer.json()["error"]["code"] == "unsupported_media_type"
    broken = await front_door.request(
        method, path, content=b"--x\r\nno", headers={"content-type": "multipart/form-data; boundary=x"}
    )
    assert broken.status_code == 400, broken.text


def test_a_body_read_without_a_gate_fails() -> None:
    """A handler that reads its body itself is a 500 (our bug, found by its first test), not a door
    without bounds."""

    @post("/ungated")
    async def ungated(request: Request[Any, Any, Any]) -> bytes:
        return await request.body()

    with TestClient(Litestar([ungated], request_class=GatedRequest)) as client:
        response = client.post("/ungated", content=b"{}")
    assert response.status_code == 500


async def test_an_admin_body_past_its_bound_is_a_413_before_it_is_decoded(
    front_door: httpx.AsyncClient,
) -> None:
    """The admin API's bodies are small by nature: their gate takes far less than a chat request's."""
    padding = "x" * (ADMIN_MAX_BODY_BYTES + 1)
    body = b'{"fallbacks": ["tiny"], "description": "' + padding.encode() + b'"}'
    response = await front_door.put(
        "/admin/pipelines/big", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "request_too_large"
    assert f"{ADMIN_MAX_BODY_BYTES:,}" in response.json()["error"]["message"]
