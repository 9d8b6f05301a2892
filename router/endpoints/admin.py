"""Operator endpoints: where every model stands, requests to load or unload one, and the routes'
weights (`router.routing`).

The front door never calls a worker: status is read from Redis (`router.status.models`), and a load
or unload request is a desired state that the workers' model controllers read: it bumps the
catalogue version (controllers read desired states again when it moved) and pokes them, so that
they act at once rather than on their next tick; a load request also notes the model in the demand
index, so that workers that do not hold it look at it.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import msgspec
import redis.asyncio as aioredis
from litestar import Request, Response, Router, get, post, put
from litestar.types import Guard

from router.admission.auth import require_admin
from router.admission.models import ModelTable
from router.http.responses import json_response
from router.intake.body import decode_body, require_json
from router.openai.errors import InvalidRequestError, RouteNotFoundError
from router.routing.table import RouteTable
from router.routing.views import RouteStatusList, WeightsRequest, route_status
from router.status import desired
from router.status.models import ModelStatusList, ModelStatusReader
from switchboard.routes import Route, WeightsError

# An admin key while auth is on. With auth off the front door is loopback-only (or its operator
# chose router.allow_open_access), and these endpoints are open like the rest.
ADMIN_GUARDS: list[Guard] = [require_admin]


@get("/models")
async def list_model_status(models: ModelTable, status: ModelStatusReader) -> Response[bytes]:
    """Every configured model, also those no worker holds."""
    statuses = await status.read(models.names())
    return json_response(ModelStatusList(data=statuses, time=time.time()))


# Model names may hold slashes (`Qwen/Qwen2.5-0.5B`), so the name is the rest of the path.
@get("/models/{name:path}")
async def model_status(name: str, models: ModelTable, status: ModelStatusReader) -> Response[bytes]:
    """One configured model."""
    name = name.strip("/")
    models.require(name)
    return json_response(await status.read_one(name))


@post("/models/{target:path}", status_code=202)
async def request_model_state(
    request: Request[Any, Any, Any],
    target: str,
    models: ModelTable,
    status: ModelStatusReader,
    redis: aioredis.Redis,
) -> Response[bytes]:
    """`POST /admin/models/{name}/load` or `/unload`: ask the workers' controllers to act (202).

    Sent as JSON only (415 otherwise, the body itself may be empty): a web page's form cannot send
    that type, and a page's script cannot without the server's leave (a CORS preflight, never granted).
    """
    require_json(request)
    name, _, action = target.strip("/").rpartition("/")
    if action not in ("load", "unload") or not name:
        raise RouteNotFoundError(f"No endpoint POST /admin/models{target}; use .../{{name}}/load or /unload.")
    models.require(name)
    return await _request(redis, status, name, "load" if action == "load" else "unload")


async def _request(
    redis: aioredis.Redis, status: ModelStatusReader, name: str, action: Literal["load", "unload"]
) -> Response[bytes]:
    await desired.request_model_state(redis, name, action)
    return json_response(await status.read_one(name), status_code=202)


_weights_request = msgspec.json.Decoder(WeightsRequest)


@get("/routes")
async def list_routes(routes: RouteTable) -> Response[bytes]:
    """Every configured route with its live weights."""
    found = [_route(routes, name) for name in routes.names()]
    return json_response(RouteStatusList(data=[route_status(route) for route in found]))


@get("/routes/{name:str}")
async def show_route(name: str, routes: RouteTable) -> Response[bytes]:
    """One route with its live weights, or a 404."""
    return json_response(route_status(_route(routes, name)))


@put("/routes/{name:str}/weights")
async def set_route_weights(
    request: Request[Any, Any, Any], name: str, routes: RouteTable
) -> Response[bytes]:
    """New weights for a route (JSON `{"weights": {"model": percent, ...}}`): every target named once,
    whole percents summing to 100, or a 400. Every front door applies them within a second."""
    _route(routes, name)
    body = await decode_body(request, _weights_request)
    try:
        route = await routes.set_weights(name, body.weights)
    except WeightsError as exc:
        raise InvalidRequestError(f"Route {name}: {exc}", param="weights") from None
    return json_response(route_status(route))


def _route(routes: RouteTable, name: str) -> Route:
    route = routes.get(name)
    if route is None:
        known = ", ".join(routes.names()) or "none"
        raise RouteNotFoundError(f"No route `{name}`; the routes are: {known}.")
    return route


def admin_router() -> Router:
    """The `/admin` endpoints, behind ADMIN_GUARDS."""
    return Router(
        path="/admin",
        route_handlers=[
            list_model_status,
            model_status,
            request_model_state,
            list_routes,
            show_route,
            set_route_weights,
        ],
        guards=ADMIN_GUARDS,
    )
