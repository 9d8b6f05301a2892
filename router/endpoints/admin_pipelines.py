"""Operator endpoints for model pipelines (`switchboard.config.pipelines`): list, show, set and delete
them at run time, every front door applying a change within about a second
(`router.routing.pipelines.pipeline_table`).

A definition set here is checked exactly as the config's is at start, over the whole set it would
leave with the configured models and routes: a 400 that says what is wrong (a loop with the path
it takes, a step that names nothing, a name that is a model's or a route's), and nothing changes.
Deleting takes back what was set here: a configured pipeline returns to the config's definition,
one created here goes, unless a route or another pipeline still names it (409).
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, delete, get, put

from router.gate.admin import PIPELINE_DEFINITION
from router.gate.gate import GATE_OPT
from router.http.answers import json_response
from router.openai.errors import InvalidRequestError, OpenAIError, RouteNotFoundError
from router.routing.pipelines.pipeline_table import (
    PipelineConflict,
    PipelineEntry,
    PipelineTable,
    UnknownPipeline,
)
from router.routing.pipelines.pipeline_views import PipelineDeleted, PipelineStatusList, pipeline_status
from switchboard.config import RouteName
from switchboard.config.pipeline_checks import PipelineError
from switchboard.name_graph import LoopError


class PipelineConflictError(OpenAIError):
    """A pipeline that cannot be deleted now: others name it, or its configured definition no longer
    fits (409)."""

    status_code = 409
    error_type = "invalid_request_error"
    default_code = "pipeline_conflict"


@get("/pipelines")
async def list_pipelines(pipelines: PipelineTable) -> Response[bytes]:
    """Every pipeline in effect: the config's, then those created here."""
    entries = [_entry(pipelines, name) for name in pipelines.names()]
    return json_response(PipelineStatusList(data=[pipeline_status(entry) for entry in entries]))


@get("/pipelines/{name:str}")
async def show_pipeline(name: str, pipelines: PipelineTable) -> Response[bytes]:
    """One pipeline: its shape, steps, definition and whose it is; or a 404."""
    return json_response(pipeline_status(_entry(pipelines, name)))


@put("/pipelines/{name:str}", opt={GATE_OPT: PIPELINE_DEFINITION})
async def set_pipeline(
    request: Request[Any, Any, Any], name: str, pipelines: PipelineTable
) -> Response[bytes]:
    """Set pipeline `name` (JSON: the fields of its TOML table, `fallbacks`, `router` or `cascade`):
    a configured pipeline's new definition, or a new pipeline. 400 for one the config could not
    hold; every front door applies it within about a second."""
    config = await PIPELINE_DEFINITION.passed(request)
    _check_name(name)
    try:
        entry = await pipelines.put(name, config)
    except (PipelineError, LoopError) as exc:
        raise InvalidRequestError(f"Pipeline {name}: {exc}", code="invalid_pipeline") from None
    except PipelineConflict as exc:
        raise PipelineConflictError(f"Pipeline {name}: {exc}") from None
    return json_response(pipeline_status(entry))


@delete("/pipelines/{name:str}", status_code=200)
async def delete_pipeline(name: str, pipelines: PipelineTable) -> Response[bytes]:
    """Take back what was set here for `name`: the configured definition it returns to, or (for a
    pipeline created here, now gone) `{"id", "object": "pipeline", "deleted": true}` as OpenAI
    answers a deletion; 404 for a name that is no pipeline; 409 while a route or another pipeline
    names it."""
    try:
        entry = await pipelines.remove(name)
    except UnknownPipeline:
        raise _not_found(pipelines, name) from None
    except PipelineConflict as exc:
        raise PipelineConflictError(f"Pipeline {name}: {exc}") from None
    if entry is None:
        return json_response(PipelineDeleted(id=name))
    return json_response(pipeline_status(entry))


PIPELINE_HANDLERS = [list_pipelines, show_pipeline, set_pipeline, delete_pipeline]


def _entry(pipelines: PipelineTable, name: str) -> PipelineEntry:
    entry = pipelines.entry(name)
    if entry is None:
        raise _not_found(pipelines, name)
    return entry


def _not_found(pipelines: PipelineTable, name: str) -> RouteNotFoundError:
    known = ", ".join(pipelines.names()) or "none"
    return RouteNotFoundError(f"No pipeline `{name}`; the pipelines are: {known}.")


def _check_name(name: str) -> None:
    """A 400 for a name the config could not give a pipeline (a route's name: one path segment)."""
    try:
        msgspec.convert(name, RouteName)
    except msgspec.ValidationError as exc:
        raise InvalidRequestError(
            f"Pipeline name {name!r}: {exc}; a name takes 1 to 128 letters, digits, '.', '_', ':' or '-'.",
            param="name",
        ) from None
