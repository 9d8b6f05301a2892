"""What this worker should load, wake, put to sleep or unload now: a pure function of one `View`.

Each worker asks `decide` for itself every second or on a poke. Rules, in the order they apply:
operator unloads; the keep-alive ladder (warm → asleep → cold, never below `min_replicas`); then at
most one Load or Wake, for the most urgent model: wake a model asleep here, load a model nobody holds
(scale from zero) or one short of `min_replicas`, or add a replica when the expected wait for its
queue exceeds its measured load time (scale out). A load that needs room evicts the models whose
loss costs least; a busy model is evicted only after a minimum residency and only for a model whose
oldest job has been passed over longer than a bound, so a worker alternating between models serves
each model's queue in groups instead of thrashing.

A remote model's load here costs the fetch of its files first, unless this node's cache has them: a
cold model is left for a few seconds to a worker whose node has its files and room, unless fetching
here would be quicker, and a scale-out weighs the fetch with the load. Apart from loads, one
Prefetch at a time fetches the files of a model an operator asked for, or that `min_replicas` keeps,
into this node's cache.

A LoRA adapter is a model whose load needs its base warm here: its demand counts as its base's
(which loads first, once, where it fits), then it loads onto the warm base, evicting the idle
sibling adapter cheapest to lose when the base's engine holds all it may. It takes no place among
the models a worker holds; a base stays while adapters are held on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from switchboard import keep_alive
from workers.controller.actions import Action, Load, Prefetch, Sleep, Unload, Wake
from workers.controller.view import ModelView, View, WorkerLimits

# How long a waiting job lets another worker that has room load its model first, instead of this
# one evicting something: long enough to cover a heartbeat that is a few seconds stale.
OTHERS_FIRST_GRACE_S = 5.0

# The reload cost assumed for a victim whose load time was never measured on this kind of worker.
UNMEASURED_LOAD_S = 60.0


def decide(view: View) -> list[Action]:
    """This worker's actions now: Unloads and Sleeps first, then at most one Load or Wake.

    A whole model loads only while no other whole model loads or unloads here (they compete for the
    same cores, memory and disk); an adapter's load is milliseconds of its base's engine, so it waits
    for no other transition, and a burst of cold adapters loads one per pass, not one per the last
    one's end."""
    leaving: dict[str, Action] = {action.model: action for action in _operator_unloads(view)}
    for action in _keep_alive_moves(view, leaving):
        leaving[action.model] = action
    departures = list(leaving.values()) + _prefetch(view)
    whole_busy = any(m.state in ("loading", "unloading") and m.base is None for m in view.models)
    for model in sorted(view.models, key=_urgency):
        if whole_busy and model.base is None:
            continue
        arrival = None if model.name in leaving else _arrival(view, model, leaving)
        if arrival is not None:
            return departures + arrival
    return departures


def _prefetch(view: View) -> list[Action]:
    """At most one fetch of files ahead of any load: a wanted model's whose files this node lacks."""
    if any(model.fetching_here for model in view.models):
        return []  # one fetch at a time: a second would only halve the first's rate
    for model in view.models:
        if model.prefetch_wanted and not model.files_here and model.state == "cold":
            return [Prefetch(model=model.name, why="fetch its files into this node's cache ahead of a load")]
    return []


def _operator_unloads(view: View) -> list[Action]:
    """Unload every replica here whose load began before an operator asked to unload the model."""
    unloads: list[Action] = []
    for model in view.models:
        requested_at = model.unload_requested_at
        if model.state in ("cold", "unloading") or requested_at is None:
            continue
        # A replica held without a recorded load start was loaded before anything we know of.
        started = model.load_started if model.load_started is not None else float("-inf")
        if started < requested_at:
            why = "an operator asked to unload it (POST /admin/models/…/unload)"
            unloads.append(Unload(model=model.name, why=why))
    return unloads


def _keep_alive_moves(view: View, leaving: Mapping[str, Action]) -> list[Action]:
    """Sleep or unload models idle past their keep-alive, never taking a model below `min_replicas`.

    Replica numbers below `min_replicas` are the minimum set and never leave by keep-alive, so two
    idle holders of a model with `min_replicas = 1` cannot both leave at once.
    """
    moves: list[Action] = []
    for model in view.models:
        if model.name in leaving or model.replicas <= model.min_replicas:
            continue
        if model.replica is not None and model.replica < model.min_replicas:
            continue
        move = _keep_alive_move(view.now, model)
        if move is not None:
            moves.append(move)
    return moves


def _keep_alive_move(now: float, model: ModelView) -> Action | None:
    """The next rung of the ladder for one model here, if its idle time has reached it."""
    if model.waiting > 0 or model.in_flight > model.batch_in_flight or model.adapters_here > 0:
        # A base stays while adapters are held on it: they leave first, by their own. Batch lines
        # alone keep no model warm: once it goes, the rest wait for it to be wanted again.
        return None
    limit_s = keep_alive.idle_limit_s(model.state, model.keep_alive_s, model.asleep_keep_alive_s)
    idle_s = _idle_s(now, model)
    if limit_s is None or idle_s < limit_s:
        return None
    why = f"idle {_secs(idle_s)} s ≥ keep_alive {_secs(model.keep_alive_s)} s"
    if model.state == "warm":
        return Sleep(model=model.name, why=why) if model.can_sleep else Unload(model=model.name, why=why)
    return Unload(model=model.name, why=f"{why} + asleep_keep_alive {_secs(model.asleep_keep_alive_s)} s")


def _urgency(model: ModelView) -> tuple[bool, float, str]:
    """Sort key, most urgent first: operator requests and min_replicas, then the longest-waiting job."""
    asked = model.load_requested or model.replicas < model.min_replicas
    return (not asked, -model.oldest_waiting_s, model.name)


def _arrival(view: View, model: ModelView, leaving: Mapping[str, Action]) -> list[Action] | None:
    """The Wake, or the Load with its evictions, that `model` needs here now; None if it needs none."""
    if model.state == "sleeping":
        # Waking here is cheaper than any load elsewhere.
        if model.waiting > 0 or model.load_requested:
            return [Wake(model=model.name, why=f"{_demand(model)}; asleep here")]
        return None
    if model.state != "cold" or (model.retry_at is not None and model.retry_at > view.now):
        return None
    if model.base is not None and (not model.base_warm_here or model.base in leaving):
        return None  # its demand counts as its base's, which loads first (here or where it fits)
    if model.replicas < model.min_replicas or (model.replicas == 0 and _has_demand(model)):
        return _load_on_demand(view, model, leaving)
    return _scale_out(view, model, leaving)


def _load_on_demand(view: View, model: ModelView, leaving: Mapping[str, Action]) -> list[Action] | None:
    """Load a model nobody holds, or one short of `min_replicas`, evicting here if this worker is full."""
    if model.replicas < model.min_replicas:
        why = f"{model.replicas} replicas < min_replicas {model.min_replicas}"
    else:
        why = f"{_demand(model)}; nobody holds it"
    if _files_elsewhere_first(model):
        return None
    evict_busy = model.oldest_waiting_s > view.limits.max_pass_over_s
    plan = _load_plan(view, model, leaving, evict_busy=evict_busy, why=why)
    evicts = plan is not None and len(plan) > 1
    if (
        evicts
        and model.base is None
        and model.others_with_room
        and model.oldest_waiting_s < OTHERS_FIRST_GRACE_S
    ):
        return None  # a worker with room should take it without evicting anything
    return plan


def _scale_out(view: View, model: ModelView, leaving: Mapping[str, Action]) -> list[Action] | None:
    """Add a replica here when draining the queue would take longer than loading one."""
    if model.replicas < 1 or model.waiting == 0 or model.loading_replicas > 0:
        return None
    # No guesses: without a measured load time and service rate, the comparison cannot be made.
    if model.load_s is None or model.jobs_per_s <= 0 or _files_elsewhere_first(model):
        return None
    expected_wait_s = model.waiting / model.jobs_per_s
    load_s = model.load_s + (model.download_s or 0.0)
    if expected_wait_s <= load_s:
        return None
    fetch = f" + fetch {_secs(model.download_s)} s" if model.download_s else ""
    why = (
        f"expected wait {_secs(expected_wait_s)} s ({model.waiting} jobs at {model.jobs_per_s:.1f}/s)"
        f" > load {_secs(model.load_s)} s{fetch}"
    )
    return _load_plan(view, model, leaving, evict_busy=False, why=why)


def _files_elsewhere_first(model: ModelView) -> bool:
    """Whether to leave the load to another worker whose node has the files and room: for a few
    seconds, and only while fetching them here (if it was ever measured) would take longer than that."""
    if model.files_here or not model.others_with_files_and_room:
        return False
    grace_left_s = OTHERS_FIRST_GRACE_S - model.oldest_waiting_s
    return grace_left_s > 0 and (model.download_s is None or model.download_s > grace_left_s)


def _load_plan(
    view: View, model: ModelView, leaving: Mapping[str, Action], *, evict_busy: bool, why: str
) -> list[Action] | None:
    """The evictions that make room for `model`, then its Load; None if no replica or no room."""
    replica = model.next_replica
    if replica is None:
        return None
    if model.base is not None:
        victims = _adapter_victims(view, model, leaving)
    else:
        victims = _victims(view, model, leaving, evict_busy=evict_busy)
    if victims is None:
        return None
    evictions: list[Action] = [
        Unload(model=victim.name, why=_eviction_why(view, model, victim), for_model=model.name)
        for victim in victims
    ]
    return [*evictions, Load(model=model.name, replica=replica, why=why)]


def _victims(
    view: View, model: ModelView, leaving: Mapping[str, Action], *, evict_busy: bool
) -> list[ModelView] | None:
    """The cheapest models to evict so that `model` fits: [] if it fits already, None if nothing does."""
    # Adapters live inside their base's engine: they take no place of their own.
    held = [
        m
        for m in view.models
        if m.base is None and m.state != "cold" and not isinstance(leaving.get(m.name), Unload)
    ]
    candidates = [m for m in held if m.name not in leaving and _evictable(view, m, evict_busy=evict_busy)]
    chosen: list[ModelView] = []
    for victim in sorted(candidates, key=lambda m: _eviction_cost(view.now, m)):
        if _has_room(view.limits, held, model):
            break
        chosen.append(victim)
        held.remove(victim)
    if not _has_room(view.limits, held, model):
        return None
    # A small victim taken before a large one may have become unnecessary: keep it.
    for victim in list(chosen):
        if _has_room(view.limits, [*held, victim], model):
            chosen.remove(victim)
            held.append(victim)
    return chosen


def _adapter_victims(view: View, model: ModelView, leaving: Mapping[str, Action]) -> list[ModelView] | None:
    """The sibling adapter to evict from the base's engine here so that `model` fits: [] while it
    has room, the idle one cheapest to lose when it is full, None when every one is busy."""
    siblings = [m for m in view.models if m.base == model.base and m.state != "cold"]
    freed = sum(1 for m in siblings if isinstance(leaving.get(m.name), Unload))
    if model.adapter_room + freed > 0:
        return []
    idle = [
        m
        for m in siblings
        if m.name not in leaving and m.state == "warm" and not _is_busy(m) and m.replicas > m.min_replicas
    ]
    return [min(idle, key=lambda m: _eviction_cost(view.now, m))] if idle else None


def _has_room(limits: WorkerLimits, held: Sequence[ModelView], model: ModelView) -> bool:
    """Whether `model` fits beside `held` (a memory size of 0 is unknown, and counts as fitting)."""
    if len(held) >= limits.max_loaded_models:
        return False
    used_bytes = sum(m.memory_bytes for m in held)
    return model.memory_bytes == 0 or used_bytes + model.memory_bytes <= limits.memory_budget_bytes


def _evictable(view: View, victim: ModelView, *, evict_busy: bool) -> bool:
    """Whether `victim` may leave for another model: idle always, busy only after its minimum residency."""
    if victim.state not in ("warm", "sleeping") or victim.replicas <= victim.min_replicas:
        return False
    if not _is_busy(victim):
        return True
    resident_s = view.now - victim.warm_since if victim.warm_since is not None else 0.0
    return evict_busy and resident_s >= view.limits.min_residency_s


def _eviction_cost(now: float, victim: ModelView) -> tuple[bool, float]:
    """Sort key, cheapest loss first: idle before busy; long idle and cheap to reload; fewest jobs."""
    if _is_busy(victim):
        return (True, float(victim.waiting + victim.in_flight))
    load_s = victim.load_s if victim.load_s is not None else UNMEASURED_LOAD_S
    return (False, load_s / (1.0 + _idle_s(now, victim)))


def _eviction_why(view: View, model: ModelView, victim: ModelView) -> str:
    """Why `victim` leaves: the model it makes room for, and what made it evictable."""
    if _is_busy(victim):
        waited = _secs(model.oldest_waiting_s)
        return f"make room for {model.name} (oldest job waited {waited} s > {_secs(view.limits.max_pass_over_s)} s)"
    return f"make room for {model.name}; idle {_secs(_idle_s(view.now, victim))} s"


def _is_busy(model: ModelView) -> bool:
    """Whether the model has jobs running here or waiting anywhere."""
    return model.in_flight > 0 or model.waiting > 0


def _has_demand(model: ModelView) -> bool:
    """Whether anything asks for the model: waiting jobs, an operator, or `min_replicas`."""
    return model.waiting > 0 or model.load_requested or model.min_replicas > 0


def _demand(model: ModelView) -> str:
    """The demand for a model, in words for the operator's log."""
    if model.waiting > 0:
        return f"{model.waiting} jobs waiting, oldest {_secs(model.oldest_waiting_s)} s"
    if model.load_requested:
        return "load requested"
    return f"min_replicas {model.min_replicas}"


def _idle_s(now: float, model: ModelView) -> float:
    """Seconds since the model's last job here ended (0 when never recorded)."""
    return now - model.idle_since if model.idle_since is not None else 0.0


def _secs(seconds: float) -> str:
    """Seconds as an operator reads them: one decimal below 10, whole seconds above."""
    return f"{seconds:.1f}" if abs(seconds) < 10 else f"{seconds:.0f}"
