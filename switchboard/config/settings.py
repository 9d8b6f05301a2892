"""The whole settings tree (`Settings`): one table per part, read from the TOML file by
`switchboard.config.loader`. Each table's struct lives in the module named for it."""

from __future__ import annotations

import msgspec

from switchboard.config.auth import AuthConfig
from switchboard.config.files import BatchesConfig, FilesConfig
from switchboard.config.front_door import FrontDoorConfig
from switchboard.config.limits import LimitsConfig
from switchboard.config.models import ModelConfig
from switchboard.config.names import RouteName
from switchboard.config.pipelines import PipelineConfig
from switchboard.config.redis import RedisConfig
from switchboard.config.routes import RouteConfig
from switchboard.config.worker import WorkerConfig


class Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The whole configuration."""

    redis: RedisConfig = msgspec.field(default_factory=RedisConfig)
    router: FrontDoorConfig = msgspec.field(default_factory=FrontDoorConfig)
    worker: WorkerConfig = msgspec.field(default_factory=WorkerConfig)
    auth: AuthConfig = msgspec.field(default_factory=AuthConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    files: FilesConfig = msgspec.field(default_factory=FilesConfig)
    batches: BatchesConfig = msgspec.field(default_factory=BatchesConfig)
    models: list[ModelConfig] = msgspec.field(default_factory=list)
    routes: dict[RouteName, RouteConfig] = msgspec.field(default_factory=dict)
    pipelines: dict[RouteName, PipelineConfig] = msgspec.field(default_factory=dict)

    def model(self, name: str) -> ModelConfig | None:
        """The configured model called `name`, if any."""
        return next((m for m in self.models if m.name == name), None)

    def worker_models(self) -> list[ModelConfig]:
        """The models this worker process may hold (a base's adapters with it)."""
        if not self.worker.models:
            return list(self.models)
        allowed = set(self.worker.models)
        return [m for m in self.models if m.name in allowed or m.base in allowed]
