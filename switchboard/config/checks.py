"""The checks across fields that msgspec's own bounds cannot make: names unique and known, a model's
kind, engine and batching fitting together, routes and pipelines leading to configured models with
no loop, and API keys that are told apart. Each failure is a ConfigError saying what to change."""

from __future__ import annotations

from collections.abc import Mapping

from switchboard.config.auth import RESERVED_KEY_NAMES, ApiKey
from switchboard.config.models import ENGINES_OF_KIND, ModelConfig, triton_model_name
from switchboard.config.pipeline_checks import PipelineError, check_nesting, check_pipelines, leads_to
from switchboard.config.routes import RouteConfig
from switchboard.config.settings import Settings
from switchboard.name_graph import LoopError, check_no_loop
from switchboard.sources.locations import HubLocation, LocalFolder, parse_location


class ConfigError(Exception):
    """The configuration cannot be used; the message says what to change."""


def check_settings(settings: Settings) -> None:
    """ConfigError naming the first thing in `settings` that does not fit with the rest."""
    names = [m.name for m in settings.models]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"model names must be unique; repeated: {', '.join(duplicates)}")
    _check_triton_names(names)
    for model in settings.models:
        _check_model(model)
    check_adapters(settings.models)
    unknown = sorted(set(settings.worker.models) - set(names))
    if unknown:
        raise ConfigError(
            f"worker.models names unknown models: {', '.join(unknown)}; "
            f"configured models are: {', '.join(names)}"
        )
    _check_routes(settings.routes, names, list(settings.pipelines))
    try:
        check_pipelines(settings.pipelines, names, list(settings.routes))
        check_no_loop(leads_to(settings.routes, settings.pipelines))
        check_nesting(leads_to(settings.routes, settings.pipelines))
    except (PipelineError, LoopError) as exc:
        raise ConfigError(str(exc)) from None
    _check_api_keys(settings.auth.keys, [*names, *settings.routes, *settings.pipelines])
    _check_teams(settings.auth.keys, list(settings.auth.teams))


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


def _check_model(model: ModelConfig) -> None:
    """A model's kind, engine, batching and replicas agree with each other."""
    name, kind, batching = model.name, model.kind, model.batching
    allowed = ENGINES_OF_KIND[kind]
    if model.engine_name not in allowed:
        raise ConfigError(
            f"model {name!r}: a {kind!r} model runs on engine {' or '.join(map(repr, allowed))}, "
            f"not {model.engine_name!r}"
        )
    too_big = [size for size in batching.preferred_batch_sizes if size > batching.max_batch_size]
    if too_big:
        raise ConfigError(
            f"model {name!r}: batching.preferred_batch_sizes {too_big} exceed "
            f"batching.max_batch_size ({batching.max_batch_size})"
        )
    dimensions = model.matryoshka_dimensions
    if dimensions is not None and kind != "embed":
        raise ConfigError(f"model {name!r}: matryoshka_dimensions is for embedders only")
    if dimensions is not None and any(size < 1 for size in dimensions):
        raise ConfigError(f"model {name!r}: matryoshka_dimensions must be positive")
    if model.images and kind != "generate":
        raise ConfigError(
            f"model {name!r}: images are taken by generators only (a {kind!r} model takes text)"
        )
    if model.images and model.engine_name == "trtllm":
        raise ConfigError(
            f"model {name!r}: images are not served on TensorRT-LLM yet; serve the model on vLLM"
        )
    if model.max_replicas is not None and model.min_replicas > model.max_replicas:
        raise ConfigError(
            f"model {name!r}: min_replicas ({model.min_replicas}) is above "
            f"max_replicas ({model.max_replicas})"
        )
    check_location(model)


# The engines that serve LoRA adapters on a base.
LORA_ENGINES = ("vllm", "trtllm")


def check_adapters(models: list[ModelConfig]) -> None:
    """Every adapter names a base that is a configured generator on vLLM, and sets nothing that is
    its base's to set (the engine, its arguments, its kind)."""
    by_name = {model.name: model for model in models}
    for model in models:
        if model.lora is not None:
            _check_lora_base(model)
        if model.base is not None:
            check_adapter(model, by_name.get(model.base), list(by_name))


def check_adapter(adapter: ModelConfig, base: ModelConfig | None, model_names: list[str]) -> None:
    """ConfigError unless `adapter` fits `base` (None: no model of its base's name exists)."""
    name = adapter.name
    if base is None:
        raise ConfigError(
            f"model {name!r}: base {adapter.base!r} is not a configured model; "
            f"configured models are: {', '.join(model_names)}"
        )
    if base.base is not None:
        raise ConfigError(f"model {name!r}: base {base.name!r} is itself an adapter; name its base instead")
    if base.kind != "generate" or base.engine_name not in LORA_ENGINES:
        raise ConfigError(
            f"model {name!r}: base {base.name!r} is a {base.kind!r} model on {base.engine_name!r}; "
            "LoRA adapters are served on generators of vLLM or TensorRT-LLM"
        )
    own = [field for field in ("engine", "engine_args", "lora", "footprint_gib") if getattr(adapter, field)]
    if adapter.images is not None:
        own.append("images")
    if adapter.kind != "generate":
        own.append("kind")
    if own:
        raise ConfigError(
            f"model {name!r}: an adapter runs on its base's engine; remove {', '.join(own)} "
            f"(set them on {base.name!r})"
        )


def _check_lora_base(base: ModelConfig) -> None:
    if base.kind != "generate" or base.engine_name not in LORA_ENGINES:
        raise ConfigError(
            f"model {base.name!r}: LoRA adapters are served on generators of vLLM or TensorRT-LLM; "
            f"this is a {base.kind!r} model on {base.engine_name!r}"
        )


def check_location(model: ModelConfig) -> None:
    """The model's path names a folder or a store, and its storage table fits that store."""
    try:
        location = parse_location(model.path)
    except ValueError as exc:
        raise ConfigError(f"model {model.name!r}: path {exc}") from None
    storage = model.storage
    if storage is None:
        return
    if isinstance(location, LocalFolder):
        raise ConfigError(
            f"model {model.name!r}: storage is for a path in a store (s3://, hf://), not the local folder "
            f"{model.path!r}"
        )
    if isinstance(location, HubLocation) and (storage.region or storage.profile):
        raise ConfigError(
            f"model {model.name!r}: storage.region and storage.profile are for s3:// paths; the Hub "
            "takes storage.endpoint_url (a mirror) only, and HF_TOKEN from the environment"
        )


def _check_routes(
    routes: Mapping[str, RouteConfig], model_names: list[str], pipeline_names: list[str]
) -> None:
    """Every route has a free name, known targets (models or pipelines), weights it can take, and a
    shadow version that is a configured model outside its targets."""
    # Imported here: the routes module speaks to Redis, which reading a config does not need.
    from switchboard.routes import WeightsError, checked_weights

    for name, route in routes.items():
        if name in model_names:
            raise ConfigError(f"routes.{name}: a route may not take the name of a model")
        unknown = sorted(set(route.targets) - set(model_names) - set(pipeline_names))
        if unknown:
            raise ConfigError(
                f"routes.{name}: targets name unknown models: {', '.join(unknown)}; "
                f"configured models are: {', '.join(model_names)}"
                + (f"; pipelines: {', '.join(pipeline_names)}" if pipeline_names else "")
            )
        try:
            checked_weights(list(route.targets), route.targets)
        except WeightsError as exc:
            raise ConfigError(f"routes.{name}: {exc}") from None
        if route.shadow is not None:
            _check_shadow(name, route.shadow.model, list(route.targets), model_names)


def _check_shadow(name: str, shadow: str, targets: list[str], model_names: list[str]) -> None:
    if shadow not in model_names:
        raise ConfigError(
            f"routes.{name}.shadow: model {shadow!r} is not configured; "
            f"configured models are: {', '.join(model_names)}"
        )
    if shadow in targets:
        raise ConfigError(
            f"routes.{name}.shadow: model {shadow!r} is a target of the route; a shadow version gets "
            "copies of the route's requests, so it must be another model"
        )


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


def _check_teams(api_keys: list[ApiKey], teams: list[str]) -> None:
    """A key of the config names a team the config has: a team's quotas live nowhere else, so a
    misspelt name would leave the key outside its team's quotas without a word."""
    for key in api_keys:
        if key.team is not None and key.team not in teams:
            raise ConfigError(
                f"auth.keys: key {key.name!r} names team {key.team!r}, which has no [auth.teams.{key.team}] "
                f"table; configured teams are: {', '.join(teams) or 'none'}"
            )
