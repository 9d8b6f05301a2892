"""A model's store, from its configuration: None for a local folder, else the source that lists and
reads its files (`s3.py`, `hub.py`, imported only when a model needs one: their SDKs are heavy)."""

from __future__ import annotations

from switchboard.config import ModelConfig
from switchboard.sources.locations import HubLocation, S3Location, parse_location
from switchboard.sources.source import ModelSource


def source_of(model: ModelConfig, *, concurrency: int = 4) -> ModelSource | None:
    """Where the model's files are fetched from (None: a local folder, read as it is)."""
    location = parse_location(model.path)
    if isinstance(location, S3Location):
        from switchboard.sources.s3 import S3Source

        return S3Source(location, model.storage, concurrency=concurrency)
    if isinstance(location, HubLocation):
        from switchboard.sources.hub import HubSource

        return HubSource(location, model.storage)
    return None
