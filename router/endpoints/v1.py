"""The OpenAI endpoints: chat and plain completions and responses (through `router.flow`), and the
models.

Handlers ask for the parts they need (`router.app` provides them) and raise errors, never build them.
The two generation endpoints ask for one part and read their caller from the request (`caller_of`: the
guard resolved it already): Litestar resolves two or more dependencies in a task group of their own,
two tasks and a cancel scope on the path of every request.
"""

from __future__ import annotations

from typing import Any

from litestar import HttpMethod, Request, Response, get, post, route
from litestar.response import Stream

from router.admission.auth import Caller, caller_of
from router.admission.model_table import ModelTable
from router.flow import RequestFlow
from router.gate.gate import GATE_OPT
from router.gate.generation import CHAT, COMPLETIONS, RESPONSES
from router.http.answers import json_response
from router.openai.errors import RouteNotFoundError
from router.openai.models import ModelCard, ModelList
from router.routing.pipelines.pipeline_table import PipelineTable
from router.routing.pipelines.pipeline_views import pipeline_card
from router.routing.routes.route_table import RouteTable
from router.routing.routes.route_views import RouteCard


@post("/v1/chat/completions", status_code=200, opt={GATE_OPT: CHAT})
async def create_chat_completion(
    request: Request[Any, Any, Any], flow: RequestFlow
) -> Response[bytes] | Stream:
    """OpenAI Chat Completions, streamed (server-sent events) or not."""
    return await flow.answer(request, await caller_of(request), await CHAT.passed(request))


@post("/v1/completions", status_code=200, opt={GATE_OPT: COMPLETIONS})
async def create_completion(request: Request[Any, Any, Any], flow: RequestFlow) -> Response[bytes] | Stream:
    """OpenAI (legacy) Completions, streamed (server-sent events) or not."""
    return await flow.answer(request, await caller_of(request), await COMPLETIONS.passed(request))


@post("/v1/responses", status_code=200, opt={GATE_OPT: RESPONSES})
async def create_response(request: Request[Any, Any, Any], flow: RequestFlow) -> Response[bytes] | Stream:
    """OpenAI Responses, streamed (typed server-sent events) or not; nothing is stored."""
    return await flow.answer(request, await caller_of(request), await RESPONSES.passed(request))


# Nothing is stored, so there is nothing to read back or delete: a 404 that says so, not a bare one.
@route("/v1/responses/{response_id:path}", http_method=[HttpMethod.GET, HttpMethod.DELETE], status_code=200)
async def stored_response(response_id: str) -> None:
    """`GET` or `DELETE` a stored response (or its input items): none is ever stored here."""
    raise RouteNotFoundError(
        f"No response `{response_id.strip('/').split('/')[0]}` is stored: responses are not stored here "
        "(every response says `store: false`). Keep the answer you got, and send the whole conversation "
        "in `input`.",
        param="response_id",
        code="response_not_found",
    )


@get("/v1/models")
async def list_models(
    models: ModelTable, routes: RouteTable, pipelines: PipelineTable, caller: Caller
) -> Response[bytes]:
    """The models this front door routes that the caller's key may use, then the routes and the
    pipelines (the config's and the admin API's) it may use."""
    cards: list[ModelCard] = [_card(models, name) for name in models.names() if caller.may_use(name)]
    cards += [_route_card(models, routes, name) for name in routes.names() if caller.may_use(name)]
    created = int(models.started)
    cards += [
        pipeline_card(name, pipeline, created) for name, pipeline in pipelines.items() if caller.may_use(name)
    ]
    return json_response(ModelList(data=cards))


# Model names may hold slashes (`Qwen/Qwen2.5-0.5B`), so the id is the rest of the path.
@get("/v1/models/{model_id:path}")
async def retrieve_model(
    model_id: str, models: ModelTable, routes: RouteTable, pipelines: PipelineTable, caller: Caller
) -> Response[bytes]:
    """One model (or route, or pipeline) this front door routes, or a 404; a 403 for one the caller's
    key may not use."""
    name = model_id.strip("/")
    pipeline = pipelines.get(name)
    if pipeline is not None:
        caller.require_model(name)
        return json_response(pipeline_card(name, pipeline, int(models.started)))
    if routes.get(name) is not None:
        caller.require_model(name)
        return json_response(_route_card(models, routes, name))
    models.resolve(name, caller)
    return json_response(_card(models, name))


def _card(models: ModelTable, name: str) -> ModelCard:
    return ModelCard(
        id=name,
        created=int(models.started),
        kind=models.kind(name),
        parent=models.base(name),
        input_modalities=["text", "image"] if models.takes_images(name) else ["text"],
    )


def _route_card(models: ModelTable, routes: RouteTable, name: str) -> RouteCard:
    route = routes.get(name)
    targets = list(route.targets) if route is not None else []
    return RouteCard(id=name, created=int(models.started), targets=targets)
