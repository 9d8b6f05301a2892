"""How pipelines are shown: to operators (`/admin/pipelines`) and in the OpenAI model list (`/v1/models`)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from router.openai.models import ModelCard
from router.routing.pipelines.pipeline_table import PipelineEntry
from switchboard.config import PipelineConfig
from switchboard.config.pipelines import Shape


class PipelineCard(ModelCard, kw_only=True):
    """A pipeline in `/v1/models`: a model card that says it is a pipeline, of which shape and steps
    (a router's model then its targets; a cascade's draft then its strong model)."""

    owned_by: str = "switchboard-pipeline"
    shape: Shape = "fallbacks"
    steps: list[str] = msgspec.field(default_factory=list)
    # The steps again, for a pipeline of fallbacks (empty for the other shapes).
    fallbacks: list[str] = msgspec.field(default_factory=list)


class PipelineStatus(msgspec.Struct, kw_only=True):
    """A pipeline as `/admin/pipelines` shows it: its definition in effect, and whose it is."""

    name: str
    shape: Shape
    steps: list[str]
    # "config": the TOML's; "admin": set through the admin API (over the TOML's, or a new pipeline).
    source: Literal["config", "admin"]
    # The fields of its table, as `PUT /admin/pipelines/{name}` takes them.
    definition: dict[str, Any]


class PipelineStatusList(msgspec.Struct, kw_only=True):
    """Body of `GET /admin/pipelines`."""

    data: list[PipelineStatus]
    object: Literal["list"] = "list"


class PipelineDeleted(msgspec.Struct, kw_only=True):
    """Body of `DELETE /admin/pipelines/{name}` for a pipeline created there, now gone."""

    id: str
    object: Literal["pipeline"] = "pipeline"
    deleted: bool = True


def pipeline_card(name: str, pipeline: PipelineConfig, created: int) -> PipelineCard:
    """The card of pipeline `name`."""
    return PipelineCard(
        id=name, created=created, shape=pipeline.shape, steps=pipeline.steps(), fallbacks=pipeline.fallbacks
    )


def pipeline_status(entry: PipelineEntry) -> PipelineStatus:
    """What an operator sees of a pipeline."""
    return PipelineStatus(
        name=entry.name,
        shape=entry.config.shape,
        steps=entry.config.steps(),
        source=entry.source,
        definition=definition(entry.config),
    )


def definition(pipeline: PipelineConfig) -> dict[str, Any]:
    """The fields of a pipeline's table that it sets (its shape's), as JSON takes them."""
    fields: dict[str, Any] = msgspec.to_builtins(pipeline)
    return {field: value for field, value in fields.items() if value not in (None, [])}
