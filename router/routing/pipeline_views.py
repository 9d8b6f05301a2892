"""How pipelines are shown in the OpenAI model list (`/v1/models`)."""

from __future__ import annotations

import msgspec

from router.openai.models import ModelCard
from switchboard.model_pipelines import PipelineConfig


class PipelineCard(ModelCard, kw_only=True):
    """A pipeline in `/v1/models`: a model card that says it is a pipeline, and of which steps."""

    owned_by: str = "switchboard-pipeline"
    fallbacks: list[str] = msgspec.field(default_factory=list)


def pipeline_card(name: str, pipeline: PipelineConfig, created: int) -> PipelineCard:
    """The card of pipeline `name`."""
    return PipelineCard(id=name, created=created, fallbacks=pipeline.steps())
