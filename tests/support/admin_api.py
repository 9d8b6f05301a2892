"""The operator's side of a running stack's admin API, as end-to-end tests call it: where a model
stands (`GET /admin/models/{model}`), a request to load, unload or prefetch it, and any other call."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from tests.support.stack import Stack


def model_status(stack: Stack, model: str) -> dict[str, Any]:
    """The model's status as `/admin/models/{model}` shows it."""
    with urllib.request.urlopen(f"{stack.base_url}/admin/models/{model}", timeout=10) as response:
        payload: dict[str, Any] = json.loads(response.read())
        return payload


def ask_model(stack: Stack, model: str, action: str) -> None:
    """`POST /admin/models/{model}/{action}` ("load", "unload", "prefetch"); it must be accepted."""
    request = urllib.request.Request(
        f"{stack.base_url}/admin/models/{model}/{action}",
        data=b"{}",
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 202


def admin_call(stack: Stack, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """Any admin API call: its status and decoded JSON body (errors included, never raised)."""
    request = urllib.request.Request(
        f"{stack.base_url}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())
