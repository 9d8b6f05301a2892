"""One settings tree for the front door and the workers: TOML file, then environment overrides.

Environment variables override single fields: ``SWITCHBOARD_<SECTION>__<FIELD>`` (for example
``SWITCHBOARD_ROUTER__PORT=8001``), ``REDIS_URL`` sets ``redis.url`` and ``REDIS_URL_FILE`` sets
``redis.url_file``. Values are read as TOML
literals where they parse as one (numbers, booleans, arrays) and as plain strings otherwise.
Everything is validated at start, so a typo fails loudly before anything serves.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from switchboard import keys
from switchboard.config_env import EnvironmentOverrideError, apply_environment
from switchboard.config_names import ModelName, RouteName
from switchboard.model_pipelines import (
    PipelineConfig,
    PipelineError,
    check_nesting,
    check_pipelines,
    leads_to,
    router_models,
)
from switchboard.name_graph import LoopError, check_no_loop
from switchboard.pooling_config import (
    DEFAULT_ENGINE,
    POOLING_KINDS,
    BatchingConfig,
    EngineName,
    ModelKind,
    PoolingConfigError,
    check_pooling,
)
from switchboard.redis_address import RedisAddressError, checked_redis_url
from switchboard.route_config import RouteConfig, RouteConfigError, check_routes
from switchboard.router_config import RouterConfig

DEMO_MODEL_NAME = "switchboard-demo"


class ConfigError(Exception):
    """The configuration cannot be used; the message says what to change."""


class ModelConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One model that Switchboard can serve."""

    name: ModelName
    path: str
    # A generator (chat and completions), or a pooling model: an embedder, a classifier or a
    # reranker that scores documents against a query (switchboard/pooling_config.py).
    kind: ModelKind = "generate"
    # None: the kind's engine (vLLM for generators, the PyTorch runner for the pooling kinds).
    engine: EngineName | None = None
    # Passed to the engine as they are (for vLLM: AsyncEngineArgs fields; for TensorRT-LLM: the
    # LLM's TorchLlmArgs fields, over Switchboard's defaults: see workers/engines/trtllm_args.py).
    engine_args: dict[str, Any] = msgspec.field(default_factory=dict)
    # Seconds the model stays warm with nothing to do: 0 leaves as soon as it is idle, -1 never.
    keep_alive_s: Annotated[float, msgspec.Meta(ge=-1)] = 300.0
    # Where the engine can sleep (vLLM sleep mode, GPUs only), an idle model sleeps first and
    # leaves only after this many more seconds asleep; -1 keeps it asleep.
    asleep_keep_alive_s: Annotated[float, msgspec.Meta(ge=-1)] = 1800.0
    # Replicas kept however idle the model is (0 = scale to zero) and at most (None = no limit).
    min_replicas: Annotated[int, msgspec.Meta(ge=0)] = 0
    max_replicas: Annotated[int, msgspec.Meta(ge=1)] | None = None
    # Load one replica when the worker starts instead of on the first request.
    preload: bool = False
    # Memory the loaded model takes (GiB); measured after the first load when not declared.
    footprint_gib: Annotated[float, msgspec.Meta(gt=0)] | None = None
    # vLLM's parser for the model's own tool-call syntax ("hermes", "llama3_json", "mistral",
    # "pythonic", ...): with one, `tool_choice: "auto"` lets the model decide to call tools. The
    # TensorRT-LLM engine parses no tool calls: a trtllm model with a parser fails to load.
    tool_call_parser: str | None = None
    # Compile the engine's structured-output backend while the model loads (beside Triton's own
    # binding), so that its first constrained answer takes milliseconds rather than seconds. On for
    # every model a pipeline uses as its router (a router answers with a constrained label only).
    warm_structured_output: bool = False
    # How a worker shares its job slots (`worker.max_concurrent_jobs`) among the models warm on it
    # (see workers/jobs/shares.py). Each warm model always has a slot for a job that arrives; the
    # other slots, while scarce, go to the models with jobs waiting: the higher priority first, and
    # among equal priorities in proportion to weight. The defaults make all models equal.
    priority: int = 0
    weight: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    # Pooling kinds: how Triton's dynamic batcher groups their requests.
    batching: BatchingConfig = msgspec.field(default_factory=BatchingConfig)
    # Embedders trained to be cut short (Matryoshka): the sizes a request's `dimensions` may ask
    # for, or [] for any size up to the model's. None: the model's vectors are whole only.
    matryoshka_dimensions: list[Annotated[int, msgspec.Meta(ge=1)]] | None = None

    @property
    def engine_name(self) -> EngineName:
        """The engine the model runs on: the one its entry names, or its kind's."""
        return self.engine or DEFAULT_ENGINE[self.kind]

    @property
    def pooling(self) -> bool:
        """Whether the model answers once per input (embed, classify, score) rather than streaming text."""
        return self.kind in POOLING_KINDS


class RedisConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where the queue lives. No URL means `switchboard up` starts a private redis-server.

    A password goes in the URL (`redis://:PASSWORD@host:6379/0`, or `redis://USER:PASSWORD@...` with
    ACL users); `rediss://` speaks TLS. A primary that Sentinel watches is reached through its
    sentinels, and every part follows a failover without a restart:
    `redis+sentinel://:PASSWORD@host1:26379,host2,host3/MASTER_NAME/0?sentinel_password=...`
    (`rediss+sentinel://` for TLS, with `ssl_ca_certs`, `ssl_certfile`, `ssl_keyfile`, `ssl_cert_reqs`
    and `ssl_check_hostname` options; see switchboard/redis_address.py).
    """

    url: str | None = None
    # A file that holds the URL (a mounted secret, say), so that a password in it is on no command
    # line and in no environment; `url` wins where both are set. Read once, at start.
    url_file: str | None = None
    # Every key Switchboard writes starts with this, so that several deployments can share a Redis.
    key_prefix: Annotated[str, msgspec.Meta(max_length=64, pattern=keys.PREFIX_PATTERN)] = "sb"
    # The private redis-server of `switchboard up` holds at most this much (Redis units: "512mb",
    # "2gb"); past it, writes are refused (noeviction) and requests get a 503 instead of losing jobs.
    private_maxmemory: Annotated[str, msgspec.Meta(pattern=r"^[0-9]+([kmg]b?)?$")] = "1gb"
    # Where that private Redis keeps its append-only file, so that queued jobs, API keys and
    # measured load times survive a restart of it; "" keeps nothing.
    private_dir: str = "~/.cache/switchboard/redis"


Sha256Hex = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")]
# Key names the product gives itself, which no key may take in any case of its letters: the admin
# key given as `auth.admin_key_sha256`, and requests while auth is off.
ADMIN_KEY_NAME = "admin"
OPEN_ACCESS_NAME = "anonymous"
RESERVED_KEY_NAMES = frozenset({ADMIN_KEY_NAME, OPEN_ACCESS_NAME})
KeyName = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._@-]+$")]
PositiveLimit = Annotated[int, msgspec.Meta(ge=1)]


class ApiKey(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One API key, known by the SHA-256 of its secret (`switchboard keys add` makes both).

    The same record lives in the config (`[[auth.keys]]`) or in Redis (`switchboard keys add`).
    """

    name: KeyName
    sha256: Sha256Hex
    # Models the key may use; empty: every model.
    models: list[str] = msgspec.field(default_factory=list)
    # Requests and tokens (prompt and completion) per minute, requests in flight at once; None: no limit.
    rpm: PositiveLimit | None = None
    tpm: PositiveLimit | None = None
    max_parallel: PositiveLimit | None = None
    # May call the /admin endpoints.
    admin: bool = False
    created: float | None = None


class AuthConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Who may call the front door: `Authorization: Bearer <key>` once any key exists."""

    # Ask for a key even while none exists (every request is then refused).
    required: bool = False
    # Keys kept in the config; `switchboard keys add` keeps them in Redis instead.
    keys: list[ApiKey] = msgspec.field(default_factory=list)
    # SHA-256 of an admin key given outside the config file (SWITCHBOARD_AUTH__ADMIN_KEY_SHA256).
    admin_key_sha256: Sha256Hex | None = None
    # How long a front door trusts its copy of the keys in Redis: a removed key works this much longer.
    cache_s: Annotated[float, msgspec.Meta(ge=0)] = 2.0


class LimitsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Admission bounds: past them a request is refused at once (429 with Retry-After)."""

    # Requests admitted and not finished, across every front door sharing the Redis.
    max_in_flight: PositiveLimit = 2048
    # Jobs waiting on one model's stream that no worker has taken yet.
    max_queue_depth: PositiveLimit = 1024
    # Completion tokens counted against a key's tpm for a request without max_tokens, until the
    # job ends and its real usage replaces the estimate.
    estimated_completion_tokens: PositiveLimit = 256


# How a vLLM engine's process starts (see `WorkerConfig.engine_process`, whose default is the one).
EngineProcess = Literal["fork", "spawn"]


class WorkerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One worker process."""

    # Names of the models this worker may hold; empty means every configured model.
    models: list[str] = msgspec.field(default_factory=list)
    # Models held at once (warm, loading or asleep), whatever the memory budget says.
    max_loaded_models: Annotated[int, msgspec.Meta(ge=1)] = 3
    # Memory the worker's models may take together (GiB): GPU memory on GPU workers, RAM on CPU
    # workers. None takes 90% of the GPU's memory, or 80% of the RAM available at start.
    memory_budget_gib: Annotated[float, msgspec.Meta(gt=0)] | None = None
    # What kind of machine this is, for the load times measured per model and kind (None: the GPU's
    # name, or "cpu").
    kind: str | None = None
    # A model that was loaded stays at least this long before another model may evict it ...
    min_residency_s: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    # ... unless a job of the evicting model has waited longer than this (no job waits forever).
    max_pass_over_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    # After a failed load, the model is not tried again for this long; it doubles with each
    # failure in a row, up to load_backoff_max_s.
    load_backoff_s: Annotated[float, msgspec.Meta(gt=0)] = 15.0
    load_backoff_max_s: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    # How often the model controller looks at demand when nothing pokes it.
    controller_tick_s: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    # Jobs this worker runs at once, across its models (the engine batches them); a model never runs
    # more than its engine batches (vLLM's max_num_seqs), the rest wait in its stream for any worker.
    # Pooling models' jobs hold none of these: they last milliseconds, and their batches bound them.
    max_concurrent_jobs: Annotated[int, msgspec.Meta(ge=1)] = 64
    # Share those slots among the warm models (a reserve each, then by priority and weight: see
    # `models.*.priority`); false: one pool, taken in turn, so that one model's flood can hold them all.
    fair_shares: bool = True
    # With fair shares: while several models run jobs here, the engine processes of one running more
    # than its share (or of a lower priority) compute at this nice value, so that the others' jobs
    # get the cores first (workers/runtime/cpu_priority.py); needs CAP_SYS_NICE to give the normal
    # priority back, without it the worker says so and leaves them alone. false: never.
    cpu_priorities: bool = True
    background_nice: Annotated[int, msgspec.Meta(ge=1, le=19)] = 10
    # Shadow copies of routed requests (`routes.*.shadow`) run here at once, at most, and only while
    # no real job waits; None: a quarter of max_concurrent_jobs.
    max_shadow_jobs: Annotated[int, msgspec.Meta(ge=0)] | None = None
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
    # Cores kept free of engine compute on CPU workers, for Triton, the consumer and the router; a
    # CPU worker runs its own threads and Triton on these (the last cores of its affinity).
    reserved_cores: Annotated[int, msgspec.Meta(ge=0)] = 1
    # KV cache per engine on CPU workers (GiB); vLLM's CPU build refuses to start without room.
    cpu_kvcache_gib: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    # How a vLLM engine's process starts. "fork": forked from a helper process that imported vLLM
    # once at worker start (a cold load in about 2 s instead of 9 on a small CPU box, for about
    # 0.6 GiB held by the helper); vLLM versions or platforms it is not proven on (GPUs) fall back
    # to "spawn" with a warning. "spawn": vLLM's own way, a new interpreter per engine.
    engine_process: EngineProcess = "fork"
    # A job whose worker died is put back in line for another worker, which continues its answer
    # where the client's stream stopped; a job taken this many times (every worker died under it)
    # is given up: its client gets an error and the job goes to the dead-letter stream.
    max_deliveries: Annotated[int, msgspec.Meta(ge=1)] = 3
    # How often a worker looks for jobs left by dead workers on the streams of its models.
    takeover_check_s: Annotated[float, msgspec.Meta(gt=0)] = 2.0
    # A job whose front door has been gone this long, and whose stream no client resumed through
    # another front door, is cancelled: nobody would read the rest of its answer.
    orphan_grace_s: Annotated[float, msgspec.Meta(ge=0)] = 5.0
    # Seconds a worker waits for running jobs to finish when told to stop; what is still running
    # then is put back in line for another worker.
    drain_timeout_s: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    # The worker's Prometheus metrics (its own, then its Triton's) at http://HOST:PORT/metrics: the
    # first free port from metrics_port on (64 are tried, so several workers on one machine each
    # get one); 0 takes any free port. The port taken is logged and in the worker's record.
    metrics_host: str = "127.0.0.1"
    metrics_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 9180
    # Where the demo model is built when no model is configured.
    demo_model_dir: str = "~/.cache/switchboard/demo-model"


class Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The whole configuration."""

    redis: RedisConfig = msgspec.field(default_factory=RedisConfig)
    router: RouterConfig = msgspec.field(default_factory=RouterConfig)
    worker: WorkerConfig = msgspec.field(default_factory=WorkerConfig)
    auth: AuthConfig = msgspec.field(default_factory=AuthConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    models: list[ModelConfig] = msgspec.field(default_factory=list)
    routes: dict[RouteName, RouteConfig] = msgspec.field(default_factory=dict)
    pipelines: dict[RouteName, PipelineConfig] = msgspec.field(default_factory=dict)

    def model(self, name: str) -> ModelConfig | None:
        """The configured model called `name`, if any."""
        return next((m for m in self.models if m.name == name), None)

    def worker_models(self) -> list[ModelConfig]:
        """The models this worker process may hold."""
        if not self.worker.models:
            return list(self.models)
        return [m for m in self.models if m.name in self.worker.models]


def demo_model(settings: Settings) -> ModelConfig:
    """The model served when none is configured: a tiny one built locally on first run."""
    path = str(Path(settings.worker.demo_model_dir).expanduser())
    engine_args = {"max_model_len": 1024, "dtype": "float32", "enforce_eager": True}
    return ModelConfig(name=DEMO_MODEL_NAME, path=path, engine_args=engine_args)


def load_settings(path: Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Read the TOML file (if any), apply environment overrides and validate the result.

    The process's Redis keys go under the settings' `redis.key_prefix` from here on (`keys.set_prefix`):
    every command of the CLI loads its settings here, so this is the one place that sets it.
    """
    environ = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    try:
        apply_environment(raw, environ)
    except EnvironmentOverrideError as exc:
        raise ConfigError(str(exc)) from None
    try:
        settings = msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from exc
    try:
        settings.redis.url = checked_redis_url(settings.redis.url, settings.redis.url_file)
    except RedisAddressError as exc:
        raise ConfigError(str(exc)) from None
    if not settings.models:
        settings.models = [demo_model(settings)]
    _check_consistency(settings)
    routers = router_models(settings.routes, settings.pipelines)
    for model in settings.models:
        model.warm_structured_output = model.warm_structured_output or model.name in routers
    keys.set_prefix(settings.redis.key_prefix)
    return settings


def _check_triton_names(names: list[str]) -> None:
    """Two models must not meet in one Triton name (Triton's model repository also ignores case)."""
    seen: dict[str, str] = {}
    for name in names:
        key = triton_model_name(name).lower()
        if key in seen:
            raise ConfigError(
                f"models {seen[key]!r} and {name!r} would share the serving name "
                f"{triton_model_name(name)!r} (names are compared without case, with characters "
                "other than letters, digits, '.', '_' and '-' read as '_'); rename one of them"
            )
        seen[key] = name


def triton_model_name(model: str) -> str:
    """The model's name inside a worker's Triton: only letters, digits, '.', '_' and '-' are allowed."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", model)


def _check_consistency(settings: Settings) -> None:
    names = [m.name for m in settings.models]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"model names must be unique; repeated: {', '.join(duplicates)}")
    _check_triton_names(names)
    for model in settings.models:
        try:
            check_pooling(
                model.name, model.kind, model.engine_name, model.batching, model.matryoshka_dimensions
            )
        except PoolingConfigError as exc:
            raise ConfigError(str(exc)) from None
        if model.max_replicas is not None and model.min_replicas > model.max_replicas:
            raise ConfigError(
                f"model {model.name!r}: min_replicas ({model.min_replicas}) is above "
                f"max_replicas ({model.max_replicas})"
            )
    unknown = sorted(set(settings.worker.models) - set(names))
    if unknown:
        raise ConfigError(
            f"worker.models names unknown models: {', '.join(unknown)}; "
            f"configured models are: {', '.join(names)}"
        )
    try:
        check_routes(settings.routes, names, list(settings.pipelines))
    except RouteConfigError as exc:
        raise ConfigError(str(exc)) from None
    try:
        check_pipelines(settings.pipelines, names, list(settings.routes))
        check_no_loop(leads_to(settings.routes, settings.pipelines))
        check_nesting(leads_to(settings.routes, settings.pipelines))
    except (PipelineError, LoopError) as exc:
        raise ConfigError(str(exc)) from None
    _check_api_keys(settings.auth.keys, [*names, *settings.routes, *settings.pipelines])


def _check_api_keys(api_keys: list[ApiKey], model_names: list[str]) -> None:
    key_names = [k.name for k in api_keys]
    repeated = sorted({n for n in key_names if key_names.count(n) > 1})
    if repeated:
        raise ConfigError(f"auth.keys: key names must be unique; repeated: {', '.join(repeated)}")
    if len({k.sha256 for k in api_keys}) < len(api_keys):
        raise ConfigError("auth.keys: two keys have the same sha256")
    reserved = [n for n in key_names if n.casefold() in RESERVED_KEY_NAMES]
    if reserved:
        raise ConfigError(
            f"auth.keys: the key name {reserved[0]!r} is reserved (it names the admin key given as "
            "auth.admin_key_sha256, or requests while auth is off); give the key another name: its "
            "secret, its limits and its jobs stay its own, they go by its sha256, not by its name"
        )
    for key in api_keys:
        unknown = sorted(set(key.models) - set(model_names))
        if unknown:
            raise ConfigError(
                f"auth.keys: key {key.name!r} names unknown models: {', '.join(unknown)}; "
                f"configured models are: {', '.join(model_names)}"
            )
