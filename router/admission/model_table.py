"""Which model a request names, and whether anyone can serve it: a 404 for a model not routed here,
a 403 for one the caller's key may not use, a 503 at once for one that no live worker may hold."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from router.admission.auth import Caller
from router.openai.errors import ModelNotFoundError, NoWorkerForModelError
from router.status.model_status import ModelStatusReader, may_serve
from router.telemetry.requests import note_model
from switchboard.adapter_registry import AdapterRegistry
from switchboard.config import ModelConfig, ModelKind
from switchboard.vision_models import takes_images

# Requests share one read of the live workers' records this recent (no round trip per request).
WORKERS_MAX_AGE_S = 1.0
# Retry-After for a model that no live worker may hold: about when a new worker's heartbeat shows.
NO_WORKER_RETRY_S = 5.0


class ModelTable:
    """The models this front door routes, and since when (the `created` of their model cards)."""

    def __init__(
        self,
        models: Sequence[ModelConfig],
        started: float,
        routes: Sequence[str] = (),
        pipelines: Callable[[], Iterable[str]] = tuple,
        registry: AdapterRegistry | None = None,
    ) -> None:
        self._configured = {model.name: model for model in models}
        # The adapters registered at run time, kept fresh by the registry's own poll.
        self._registry = registry
        # Route and pipeline names are not models, but a 404 lists them beside the models a caller
        # may name; the pipelines are asked for each time (the admin API adds some at run time).
        self._routes = list(routes)
        self._pipelines = pipelines
        self.started = started

    def names(self) -> list[str]:
        """Every model this front door routes: the configured ones, then the registered adapters."""
        return [*self._configured, *self._registered()]

    def get(self, name: str) -> ModelConfig | None:
        """The routed model `name`'s configuration (None for a name that is no model)."""
        return self._configured.get(name) or self._registered().get(name)

    def kind(self, name: str) -> ModelKind:
        """What the routed model `name` answers: text generation, or one of the pooling kinds."""
        return self._known(name).kind

    def base(self, name: str) -> str | None:
        """The base model of the routed adapter `name` (None for a whole model)."""
        return self._known(name).base

    def takes_images(self, name: str) -> bool | None:
        """Whether the routed model `name` takes images (`switchboard.vision_models`; None: not
        known before a worker loads it)."""
        model = self._known(name)
        return takes_images(model, self.get(model.base) if model.base is not None else None)

    def _known(self, name: str) -> ModelConfig:
        model = self.get(name)
        if model is None:
            raise KeyError(name)
        return model

    def _registered(self) -> Mapping[str, ModelConfig]:
        return self._registry.registered() if self._registry is not None else {}

    def require(self, name: str, caller: Caller | None = None) -> ModelConfig:
        """The model's configuration, or a 404 in OpenAI's shape that lists the models `caller` may
        use (none without a caller: nobody learns of models their key may not use)."""
        model = self.get(name)
        if model is None:
            names = [*self.names(), *self._routes, *self._pipelines()]
            visible = [known for known in names if caller.may_use(known)] if caller else []
            raise ModelNotFoundError(name, visible)
        note_model(name)
        return model

    def resolve(self, name: str, caller: Caller) -> ModelConfig:
        """The model's configuration: a 404 unless it is routed here, then a 403 unless the caller's
        key may use it."""
        model = self.require(name, caller)
        caller.require_model(name)
        return model


async def require_live_worker(status: ModelStatusReader, model: str) -> None:
    """A 503 at once for a model that no live worker may hold (while any worker is alive: with
    none, the job waits in the queue for the first one to start)."""
    records = await status.live_workers(WORKERS_MAX_AGE_S)
    # A worker that may hold an adapter's base may hold the adapter.
    if records and not may_serve(records, status.served_on(model)):
        raise NoWorkerForModelError(model, NO_WORKER_RETRY_S)
