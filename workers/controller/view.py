"""What the policy sees: one worker's slots, the demand for every model it may hold, and measured costs.

Everything is a plain value taken at one instant (`View.now`, unix seconds), so the policy needs no
clock, no Redis and no engine, and its tests can replay recorded timings.
"""

from __future__ import annotations

import msgspec

from switchboard.wire import SlotState


class ModelView(msgspec.Struct, frozen=True, kw_only=True):
    """One model this worker may hold: its settings, its state here, its demand everywhere, its costs."""

    name: str

    # --- settings (the model's configuration) ---
    keep_alive_s: float = 300.0  # idle seconds before it leaves warm: 0 at once, -1 never
    asleep_keep_alive_s: float = 1800.0  # then seconds asleep before it leaves: -1 never
    min_replicas: int = 0
    max_replicas: int | None = None
    can_sleep: bool = False  # the engine has a sleep mode here

    # --- here (this worker's slot for the model) ---
    state: SlotState = "cold"
    replica: int | None = None  # the replica number whose lease this worker holds for it
    in_flight: int = 0  # jobs of this model running here
    batch_in_flight: int = 0  # of those, the Batch API's lines (they keep no model warm)
    load_started: float | None = None  # when the current (or last) load here began
    warm_since: float | None = None  # when it last became warm here
    idle_since: float | None = None  # when its last interactive job here ended (or it became warm)
    # What it takes here once loaded: measured when loaded, else declared, measured before or estimated.
    memory_bytes: int = 0
    # Its files are on this node: a local folder, or a remote model's files complete in the node cache.
    files_here: bool = True
    # Seconds a load here would spend fetching its files first (0 when they are here; None when
    # its size or this node's rate from its store was never measured).
    download_s: float | None = 0.0
    # Its files are being fetched into this node's cache (a load or a prefetch, by any worker here).
    fetching_here: bool = False
    # An operator asked for its files on every node, or min_replicas keeps it: fetch them ahead.
    prefetch_wanted: bool = False

    # --- everywhere (all workers) ---
    waiting: int = 0  # jobs on its stream that no worker has taken yet
    oldest_waiting_s: float = 0.0  # how long the oldest of those has waited
    replicas: int = 0  # replicas loading, warm or asleep anywhere (live leases), this worker's included
    loading_replicas: int = 0  # of which are loading or waking right now
    jobs_per_s: float = 0.0  # measured service rate of its warm replicas together
    next_replica: int | None = 0  # lowest replica number nobody holds, None when max_replicas are held
    others_with_room: bool = False  # another live worker may load it without evicting anything
    # Another live worker whose node has its files may load it without evicting anything.
    others_with_files_and_room: bool = False
    retry_at: float | None = None  # its last load failed: no load before this time
    load_requested: bool = False  # an operator asked for it, or it is preloaded and nobody holds it
    unload_requested_at: float | None = None  # an operator asked to unload replicas loaded before this

    # --- LoRA adapters ---
    base: str | None = None  # an adapter: the base whose engine serves it
    base_warm_here: bool = False  # an adapter: its base is warm here, so it can load here
    adapter_room: int = 0  # an adapter: how many more adapters its base's engine here takes
    adapters_here: int = 0  # a base: its adapters held here (it stays while they do)

    # --- measured costs on this kind of worker (None: never measured) ---
    load_s: float | None = None
    wake_s: float | None = None


class WorkerLimits(msgspec.Struct, frozen=True, kw_only=True):
    """What this worker may hold at once, and the anti-thrashing bounds."""

    max_loaded_models: int
    memory_budget_bytes: int
    # A model that is busy (jobs waiting or in flight) is evicted only after it has been warm this
    # long, and only for a model whose oldest waiting job has waited longer than max_pass_over_s.
    min_residency_s: float
    max_pass_over_s: float


class View(msgspec.Struct, frozen=True, kw_only=True):
    """One worker's snapshot for one decision."""

    now: float
    limits: WorkerLimits
    models: tuple[ModelView, ...]

    def model(self, name: str) -> ModelView:
        """The view of `name` (KeyError if this worker may not hold it)."""
        for model in self.models:
            if model.name == name:
                return model
        raise KeyError(name)
