"""Operator endpoints for LoRA adapters registered at run time (`switchboard.adapter_registry`):
list, register and remove them, every front door and worker applying a change within about a second.

A registration is checked as the config's adapters are at start: a 400 that says what is wrong (a
base that is no generator of vLLM or TensorRT-LLM, or takes no adapters registered at run time, a field that is the
base's to set, a path that is no folder or store) and nothing changes; a name already in use is a
409. The adapters of the config are listed too, and cannot be removed here (409: the config has
them). A removed adapter's next request is a 404; workers unload it where it is held.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from litestar import Request, Response, delete, get, post

from router.admission.model_table import ModelTable
from router.gate.admin import ADAPTER_DEFINITION
from router.gate.gate import GATE_OPT
from router.http.answers import json_response
from router.openai.errors import InvalidRequestError, ModelNotFoundError, OpenAIError
from router.routing.pipelines.pipeline_table import PipelineTable
from router.routing.routes.route_table import RouteTable
from switchboard.adapter_registry import AdapterExists, AdapterRegistry
from switchboard.config import ConfigError, ModelConfig

Source = Literal["config", "admin"]


class AdapterConflictError(OpenAIError):
    """A name in use, or an adapter of the config (409)."""

    status_code = 409
    error_type = "invalid_request_error"
    default_code = "adapter_conflict"


class AdapterStatus(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One adapter: its name, base and files, and whether the config or the admin API has it."""

    id: str
    base: str
    path: str
    source: Source
    keep_alive_s: float
    priority: int = 0
    object: Literal["adapter"] = "adapter"


class AdapterStatusList(msgspec.Struct, kw_only=True):
    """Body of `GET /admin/adapters`."""

    data: list[AdapterStatus]
    object: Literal["list"] = "list"


class AdapterDeleted(msgspec.Struct, kw_only=True):
    """Body of `DELETE /admin/adapters/{name}`, as OpenAI answers a model's deletion."""

    id: str
    object: Literal["model"] = "model"
    deleted: bool = True


@get("/adapters")
async def list_adapters(models: ModelTable, adapters: AdapterRegistry) -> Response[bytes]:
    """Every adapter: the config's, then those registered at run time."""
    registered = adapters.registered()
    found = [
        _status(model, "admin" if name in registered else "config")
        for name in models.names()
        if (model := models.get(name)) is not None and model.adapter
    ]
    return json_response(AdapterStatusList(data=found))


@post("/adapters", status_code=201, opt={GATE_OPT: ADAPTER_DEFINITION})
async def register_adapter(
    request: Request[Any, Any, Any],
    adapters: AdapterRegistry,
    routes: RouteTable,
    pipelines: PipelineTable,
) -> Response[bytes]:
    """Register an adapter (JSON: the fields of its `[[models]]` entry: `name`, `base`, `path`, and
    optionally `storage`, `keep_alive_s`, `priority`, `weight`, `max_replicas`): 201 with it; 400 for
    one the config could not hold; 409 for a name in use."""
    adapter: ModelConfig = await ADAPTER_DEFINITION.passed(request)
    try:
        await adapters.add(adapter, taken=[*routes.names(), *pipelines.names()])
    except AdapterExists as exc:
        raise AdapterConflictError(f"Adapter {adapter.name}: {exc}") from None
    except ConfigError as exc:
        raise InvalidRequestError(str(exc), code="invalid_adapter") from None
    return json_response(_status(adapter, "admin"), status_code=201)


# Adapter names may hold slashes (`acme/support-v3`), so the name is the rest of the path.
@delete("/adapters/{name:path}", status_code=200)
async def remove_adapter(name: str, models: ModelTable, adapters: AdapterRegistry) -> Response[bytes]:
    """Remove a registered adapter: `{"id", "object": "model", "deleted": true}`; 404 for a name that
    is no registered adapter, 409 for one of the config."""
    name = name.strip("/")
    if name not in adapters.registered():
        model = models.get(name)
        if model is not None:
            what = "an adapter of the config" if model.adapter else "a model of the config"
            raise AdapterConflictError(f"{name} is {what}; remove it from the config file instead")
    if not await adapters.remove(name):
        raise ModelNotFoundError(name, [])
    return json_response(AdapterDeleted(id=name))


ADAPTER_HANDLERS = [list_adapters, register_adapter, remove_adapter]


def _status(model: ModelConfig, source: Source) -> AdapterStatus:
    assert model.base is not None
    return AdapterStatus(
        id=model.name,
        base=model.base,
        path=model.path,
        source=source,
        keep_alive_s=model.keep_alive_s,
        priority=model.priority,
    )
