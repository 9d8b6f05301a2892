"""Operator endpoints: where every model stands, requests to load or unload one, the routes'
weights (`router.routing`), the pipelines (`router.endpoints.admin_pipelines`), the adapters
registered at run time (`router.endpoints.admin_adapters`) and the tokens keys and teams used
(`router.endpoints.admin_usage`).

The front door never calls a worker: status is read from Redis (`router.status.model_status`), and a load
or unload request is a desired state that the workers' model controllers read: it bumps the
catalogue version (controllers read desired states again when it moved) and pokes them, so that
they act at once rather than on their next tick; a load request also notes the model in the demand
index, so that workers that do not hold it look at it.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Literal

import redis.asyncio as aioredis
from litestar import Request, Response, Router, delete, get, post, put
from litestar.types import Guard

from router.admission.auth import require_admin
from router.admission.model_table import ModelTable
from router.endpoints.admin_adapters import ADAPTER_HANDLERS
from router.endpoints.admin_pipelines import PIPELINE_HANDLERS
from router.endpoints.admin_usage import USAGE_HANDLERS
from router.gate.admin import MODEL_STATE, ROLLOUT_PLAN, ROUTE_WEIGHTS
from router.gate.gate import GATE_OPT
from router.http.answers import json_response
from router.openai.errors import InvalidRequestError, OpenAIError, RouteNotFoundError
from router.queue.move_waiting import move_waiting_jobs
from router.routing.routes.route_table import RouteTable
from router.routing.routes.route_views import RouteStatusList, route_status
from router.status import desired
from router.status.model_status import ModelStatusList, ModelStatusReader
from router.telemetry.front_door_metrics import ROLLOUT_EVENTS
from switchboard.rollout import PlanError, checked_plan
from switchboard.routes import RolloutConflict, Route, WeightsError, abort_rollout, start_rollout
from switchboard.sources.locations import is_remote

logger = logging.getLogger(__name__)

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


@post("/models/{target:path}", status_code=202, opt={GATE_OPT: MODEL_STATE})
async def request_model_state(
    request: Request[Any, Any, Any],
    target: str,
    models: ModelTable,
    status: ModelStatusReader,
    redis: aioredis.Redis,
) -> Response[bytes]:
    """`POST /admin/models/{name}/load`, `/unload` or `/prefetch`: ask the workers' controllers to
    act (202). A prefetch fetches a remote model's files into the node cache of every worker that may
    hold it, without loading it.

    Sent as JSON only (415 otherwise, the body itself may be empty): a web page's form cannot send
    that type, and a page's script cannot without the server's leave (a CORS preflight, never granted).
    """
    await MODEL_STATE.passed(request)
    name, _, action = target.strip("/").rpartition("/")
    if action not in ("load", "unload", "prefetch") or not name:
        raise RouteNotFoundError(
            f"No endpoint POST /admin/models{target}; use .../{{name}}/load, /unload or /prefetch."
        )
    model = models.require(name)
    if action == "prefetch":
        if not is_remote(model.path):
            raise InvalidRequestError(
                f"{name} is read from a local folder on each worker: there is nothing to prefetch "
                "(only models at s3:// or hf:// paths are fetched into the node cache)",
                param="model",
            )
        await desired.request_prefetch(redis, name)
        return json_response(await status.read_one(name), status_code=202)
    return await _request(redis, status, name, "load" if action == "load" else "unload")


async def _request(
    redis: aioredis.Redis, status: ModelStatusReader, name: str, action: Literal["load", "unload"]
) -> Response[bytes]:
    await desired.request_model_state(redis, name, action)
    return json_response(await status.read_one(name), status_code=202)


@get("/routes")
async def list_routes(routes: RouteTable) -> Response[bytes]:
    """Every configured route with its live weights."""
    found = [_route(routes, name) for name in routes.names()]
    return json_response(RouteStatusList(data=[route_status(route) for route in found]))


@get("/routes/{name:str}")
async def show_route(name: str, routes: RouteTable) -> Response[bytes]:
    """One route with its live weights, or a 404."""
    return json_response(route_status(_route(routes, name)))


@put("/routes/{name:str}/weights", opt={GATE_OPT: ROUTE_WEIGHTS})
async def set_route_weights(
    request: Request[Any, Any, Any], name: str, routes: RouteTable
) -> Response[bytes]:
    """New weights for a route (JSON `{"weights": {"model": percent, ...}}`): every target named once,
    whole percents summing to 100, or a 400; a 409 while a rollout sets them. Every front door
    applies them within a second."""
    body = await ROUTE_WEIGHTS.passed(request)
    route = _route(routes, name)
    if route.rollout is not None and route.rollout.running:
        raise RolloutConflictError(f"Route {name}: a rollout sets its weights now; abort it first.")
    try:
        route = await routes.set_weights(name, body.weights)
    except WeightsError as exc:
        raise InvalidRequestError(f"Route {name}: {exc}", param="weights") from None
    return json_response(route_status(route))


class RolloutConflictError(OpenAIError):
    """A rollout that cannot start (one runs) or be aborted (none runs)."""

    status_code = 409
    error_type = "invalid_request_error"
    default_code = "rollout_conflict"


def _require_models(canary: str, stable: str, models: ModelTable) -> None:
    """PlanError unless both versions are models: a rollout warms its canary and judges each
    version's own answers, which a pipeline's steps share out among other models."""
    for version in (canary, stable):
        if version not in models.names():
            raise PlanError(
                f"{version!r} is a pipeline; a rollout needs models for its canary and stable version "
                "(set a pipeline's weight by hand: switchboard routes set)"
            )


@post("/routes/{name:str}/rollout", status_code=201, opt={GATE_OPT: ROLLOUT_PLAN})
async def start_route_rollout(
    request: Request[Any, Any, Any], name: str, routes: RouteTable, models: ModelTable, redis: aioredis.Redis
) -> Response[bytes]:
    """Start a progressive rollout of a canary on a route (JSON: `canary` and any of the plan's
    settings, `switchboard.rollout.RolloutPlan`): 201 with the route; 400 for a plan the route
    cannot run; 409 while one runs. The judge warms the canary, then steps its weight."""
    plan = await ROLLOUT_PLAN.passed(request)
    route = _route(routes, name)
    try:
        checked_plan(plan, route.targets, route.weights)
        _require_models(plan.canary, route.targets[0], models)
        state = await start_rollout(redis, route, plan)
    except PlanError as exc:
        raise InvalidRequestError(f"Route {name}: {exc}") from None
    except RolloutConflict as exc:
        raise RolloutConflictError(f"Route {name}: {exc}") from None
    ROLLOUT_EVENTS.labels(name, "started").inc()
    logger.info("rollout started", extra={"route": name, "canary": plan.canary, "rollout": state.id})
    return json_response(route_status(await _reread(routes, name)), status_code=201)


@delete("/routes/{name:str}/rollout", status_code=200)
async def abort_route_rollout(name: str, routes: RouteTable, redis: aioredis.Redis) -> Response[bytes]:
    """Abort the rollout running on a route: its canary back to 0 % at once, its waiting jobs moved to
    stable; 409 when none runs."""
    route = _route(routes, name)
    try:
        state = await abort_rollout(redis, route, ABORTED_BY_OPERATOR)
    except RolloutConflict as exc:
        raise RolloutConflictError(f"Route {name}: {exc}") from None
    ROLLOUT_EVENTS.labels(name, "aborted").inc()
    logger.warning("rollout aborted by operator", extra={"route": name, "canary": state.plan.canary})
    await move_waiting_jobs(redis, from_model=state.plan.canary, to_model=state.stable)
    return json_response(route_status(await _reread(routes, name)))


ABORTED_BY_OPERATOR = "aborted by operator"


async def _reread(routes: RouteTable, name: str) -> Route:
    """Route `name` as Redis holds it now (the write just made replaced the routes' version)."""
    await routes.refresh()
    return _route(routes, name)


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
            start_route_rollout,
            abort_route_rollout,
            *PIPELINE_HANDLERS,
            *ADAPTER_HANDLERS,
            *USAGE_HANDLERS,
        ],
        guards=ADMIN_GUARDS,
    )
