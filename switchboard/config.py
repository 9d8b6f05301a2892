"""One settings tree for the front door and the workers: TOML file, then environment overrides.

Environment variables override single fields: ``SWITCHBOARD_<SECTION>__<FIELD>`` (for example
``SWITCHBOARD_ROUTER__PORT=8001``), and ``REDIS_URL`` sets ``redis.url``. Values are read as TOML
literals where they parse as one (numbers, booleans, arrays) and as plain strings otherwise.
Everything is validated at start, so a typo fails loudly before anything serves.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

ENV_PREFIX = "SWITCHBOARD_"
DEMO_MODEL_NAME = "switchboard-demo"

ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:/-]+$")]


class ConfigError(Exception):
    """The configuration cannot be used; the message says what to change."""


class ModelConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One model that Switchboard can serve."""

    name: ModelName
    path: str
    engine: Literal["vllm", "trtllm"] = "vllm"
    # Passed to the engine as they are (for vLLM: AsyncEngineArgs fields).
    engine_args: dict[str, Any] = msgspec.field(default_factory=dict)


class RedisConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where the queue lives. No URL means `switchboard up` starts a private redis-server."""

    url: str | None = None


class RouterConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The front door."""

    host: str = "0.0.0.0"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8000
    # How long a request may wait for its job to finish before the client gets a 504.
    request_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 600.0


class WorkerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One worker process."""

    # Names of the models this worker serves; empty means every configured model.
    models: list[str] = msgspec.field(default_factory=list)
    # Jobs this worker runs at once, across its models (the engine batches them).
    max_concurrent_jobs: Annotated[int, msgspec.Meta(ge=1)] = 64
    # Tokens that reach the Triton callable within this window travel as one chunk. Every hop
    # after the engine costs CPU per chunk, so with many streams the window widens, up to
    # coalesce_max_ms, to keep each model under max_chunks_per_s in total.
    # The floor is about one display frame: nobody sees finer steps, and on a small box fewer
    # chunks leave the engine's scheduler more CPU (1.5x tokens/s for one stream, measured).
    coalesce_ms: Annotated[float, msgspec.Meta(ge=0)] = 15.0
    # The default budget keeps a 2-core box's front door and worker from drowning in chunks at 32
    # streams (a window of 160 ms); raise it where more cores serve the messages.
    coalesce_max_ms: Annotated[float, msgspec.Meta(ge=0)] = 200.0
    max_chunks_per_s: Annotated[float, msgspec.Meta(gt=0)] = 200.0
    heartbeat_s: Annotated[float, msgspec.Meta(gt=0)] = 2.0
    # Cores kept free of engine compute on CPU workers, for Triton, the consumer and the router.
    reserved_cores: Annotated[int, msgspec.Meta(ge=0)] = 1
    # KV cache per engine on CPU workers (GiB); vLLM's CPU build refuses to start without room.
    cpu_kvcache_gib: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    # Seconds a worker waits for running jobs to finish when told to stop.
    drain_timeout_s: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    # Where the demo model is built when no model is configured.
    demo_model_dir: str = "~/.cache/switchboard/demo-model"


class Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The whole configuration."""

    redis: RedisConfig = msgspec.field(default_factory=RedisConfig)
    router: RouterConfig = msgspec.field(default_factory=RouterConfig)
    worker: WorkerConfig = msgspec.field(default_factory=WorkerConfig)
    models: list[ModelConfig] = msgspec.field(default_factory=list)

    def model(self, name: str) -> ModelConfig | None:
        """The configured model called `name`, if any."""
        return next((m for m in self.models if m.name == name), None)

    def worker_models(self) -> list[ModelConfig]:
        """The models this worker process serves."""
        if not self.worker.models:
            return list(self.models)
        return [m for m in self.models if m.name in self.worker.models]


def demo_model(settings: Settings) -> ModelConfig:
    """The model served when none is configured: a tiny one built locally on first run."""
    path = str(Path(settings.worker.demo_model_dir).expanduser())
    engine_args = {"max_model_len": 1024, "dtype": "float32", "enforce_eager": True}
    return ModelConfig(name=DEMO_MODEL_NAME, path=path, engine_args=engine_args)


def load_settings(path: Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Read the TOML file (if any), apply environment overrides and validate the result."""
    environ = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    _apply_environment(raw, environ)
    try:
        settings = msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from exc
    if not settings.models:
        settings.models = [demo_model(settings)]
    _check_consistency(settings)
    return settings


def _apply_environment(raw: dict[str, Any], environ: Mapping[str, str]) -> None:
    if environ.get("REDIS_URL"):
        raw.setdefault("redis", {})["url"] = environ["REDIS_URL"]
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, field = name[len(ENV_PREFIX) :].lower().partition("__")
        table = raw.setdefault(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{name} overrides a field of `{section}`, which is not a table of settings")
        table[field] = _parse_literal(value)


def _parse_literal(value: str) -> Any:
    """`8001` → 8001, `[\"a\"]` → [\"a\"], `true` → True; anything else stays a string."""
    try:
        return tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return value


def _check_consistency(settings: Settings) -> None:
    names = [m.name for m in settings.models]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"model names must be unique; repeated: {', '.join(duplicates)}")
    unknown = sorted(set(settings.worker.models) - set(names))
    if unknown:
        raise ConfigError(
            f"worker.models names unknown models: {', '.join(unknown)}; "
            f"configured models are: {', '.join(names)}"
        )
