"""One settings tree for the front door and the workers: TOML file, then environment overrides.

A module per table of the tree (`settings` holds the root), the checks across fields, and the
loader. These are the names the rest of the product uses; the modules hold the rest.
"""

from switchboard.config.auth import ADMIN_KEY_NAME, RESERVED_KEY_NAMES, ApiKey, AuthConfig, TeamConfig
from switchboard.config.checks import ConfigError
from switchboard.config.files import BatchesConfig, FilesConfig
from switchboard.config.front_door import FrontDoorConfig
from switchboard.config.limits import LimitsConfig
from switchboard.config.loader import load_settings
from switchboard.config.models import (
    DEMO_MODEL_NAME,
    BatchingConfig,
    EngineName,
    LoraConfig,
    ModelConfig,
    ModelKind,
    StorageConfig,
    demo_model,
    triton_model_name,
)
from switchboard.config.names import ModelName, RouteName
from switchboard.config.pipelines import (
    CascadeConfig,
    PipelineConfig,
    PipelineLookup,
    RouterModelConfig,
    RouterTarget,
)
from switchboard.config.redis import RedisConfig
from switchboard.config.routes import RouteConfig, ShadowConfig
from switchboard.config.settings import Settings
from switchboard.config.worker import EngineProcess, WorkerConfig

__all__ = [
    "ADMIN_KEY_NAME",
    "DEMO_MODEL_NAME",
    "RESERVED_KEY_NAMES",
    "ApiKey",
    "AuthConfig",
    "BatchesConfig",
    "BatchingConfig",
    "CascadeConfig",
    "ConfigError",
    "EngineName",
    "EngineProcess",
    "FilesConfig",
    "FrontDoorConfig",
    "LimitsConfig",
    "LoraConfig",
    "ModelConfig",
    "ModelKind",
    "ModelName",
    "PipelineConfig",
    "PipelineLookup",
    "RedisConfig",
    "RouteConfig",
    "RouteName",
    "RouterModelConfig",
    "RouterTarget",
    "Settings",
    "ShadowConfig",
    "StorageConfig",
    "TeamConfig",
    "WorkerConfig",
    "demo_model",
    "load_settings",
    "triton_model_name",
]
