"""The scale benchmark's figures from what the fleets recorded and what the load sent (pure functions).

Times are unix seconds. A model is *held* by a worker from the controller's load action there to its
next unload action there (or, where the controller's actions were not recorded, from its engine's
load to its engine's stop). A request is *cold* when no worker holds its model as it is sent; the
first cold request before a load is the one that load answers, and its *cold wait* is the time from
sending it to that load's action. A *load storm* is a load of a model that starts while another
worker's load of the same model is still in progress: two loads where one was wanted (the policy
never adds a replica while one is loading). A point is *saturated* when the simulated workers were
CPU-bound: they then run fewer passes than real workers would, and Redis sees less than it would.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from loadgen import percentile
from scale_load import Sent
from scale_samples import between

INFINITY = float("inf")
# Simulated workers are CPU-bound when a process of them is this busy (cores), when the machine (the
# stack and anything else on it) is this busy, or when their passes take this long.
SATURATED_CPU = 0.75
SATURATED_MACHINE = 0.85
SATURATED_PASS_MS = 500.0
# A point is contended when other work on the machine (not the stack, not this benchmark) took this
# many cores during its idle or open-loop phase.
CONTENDED_CPU = 0.5


@dataclass(frozen=True)
class Holding:
    """One worker's hold on one model: from its load action to its unload action."""

    worker: str
    start: float
    end: float  # INFINITY while held at the end
    warm_at: float  # when its engine finished loading (INFINITY if never)


def holdings(records: Iterable[dict[str, Any]]) -> dict[str, list[Holding]]:
    """Every hold of every model, by model, in order of start, from the fleets' records."""
    actions: dict[tuple[str, str], list[tuple[float, str]]] = defaultdict(list)
    loads: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    stops: dict[tuple[str, str], list[float]] = defaultdict(list)
    any_actions = False
    for record in records:
        for worker, action, model, at in record.get("actions", []):
            any_actions = True
            if action in ("load", "unload"):
                actions[(worker, model)].append((at, action))
        for worker, model, began, ended in record["loads"]:
            loads[(worker, model)].append((began, INFINITY if ended is None else ended))
        for worker, model, at in record["stops"]:
            stops[(worker, model)].append(at)
    if not any_actions:  # fall back on the engines' own load and stop times
        for key, spans in loads.items():
            actions[key] = [(began, "load") for began, _ in spans] + [(at, "unload") for at in stops[key]]
    held: dict[str, list[Holding]] = defaultdict(list)
    for (worker, model), events in actions.items():
        engine_loads = sorted(loads[(worker, model)])
        start: float | None = None
        for at, action in sorted(events):
            if action == "load" and start is None:
                start = at
            elif action == "unload" and start is not None:
                held[model].append(Holding(worker, start, at, _warm_at(engine_loads, start, at)))
                start = None
        if start is not None:
            held[model].append(Holding(worker, start, INFINITY, _warm_at(engine_loads, start, INFINITY)))
    return {model: sorted(spans, key=lambda h: h.start) for model, spans in held.items()}


def _warm_at(engine_loads: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """When the first engine load begun within [start, end) ended."""
    return next((ended for began, ended in engine_loads if start <= began < end), INFINITY)


def cold_waits(sent: Iterable[Sent], held: dict[str, list[Holding]]) -> tuple[list[float], int]:
    """Seconds from each cold period's first request to the load that answered it; and how many
    cold requests saw no load start at all."""
    waits: list[float] = []
    never = 0
    by_model: dict[str, list[Sent]] = defaultdict(list)
    for request in sent:
        by_model[request.model].append(request)
    for model, requests in by_model.items():
        spans = held.get(model, [])
        starts = [span.start for span in spans]
        answered: set[int] = set()
        for request in sorted(requests, key=lambda r: r.sent_at):
            at = request.sent_at
            if any(span.start <= at < span.end for span in spans):
                continue
            following = bisect.bisect_right(starts, at)
            if following == len(starts):
                never += 1
            elif following not in answered:
                answered.add(following)
                waits.append(starts[following] - at)
    return waits, never


def load_storms(held: dict[str, list[Holding]]) -> tuple[list[dict[str, Any]], int]:
    """Loads started while another worker's load of the model was in progress (storms: each with the
    model, when, and the seconds since the load it overlapped began), and how many loads started
    while another worker already held the model warm (added replicas)."""
    storms: list[dict[str, Any]] = []
    replicas = 0
    for model, spans in held.items():
        for index, span in enumerate(spans):
            others = [o for o in spans[:index] if o.worker != span.worker and o.start <= span.start < o.end]
            loading = [o for o in others if o.warm_at > span.start]
            if loading:
                after_s = round(span.start - max(o.start for o in loading), 3)
                storms.append({"model": model, "at": span.start, "after_s": after_s})
            elif others:
                replicas += 1
    return storms, replicas


def within(rows: Iterable[Sequence[Any]], start: float, end: float, at: int = 0) -> list[Sequence[Any]]:
    """The rows whose time (column `at`) falls in [start, end)."""
    return [row for row in rows if start <= row[at] < end]


def pass_stats(records: Iterable[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    """The controller passes that began in [start, end): how many per second, and their durations."""
    passes = [row for record in records for row in within(record["passes"], start, end)]
    durations_ms = sorted(seconds * 1000 for _, seconds in passes)
    return {
        "passes": len(passes),
        "passes_per_s": round(len(passes) / max(end - start, 1e-9), 1),
        "pass_p50_ms": percentile(durations_ms, 50),
        "pass_p99_ms": percentile(durations_ms, 99),
    }


def request_stats(sent: Sequence[Sent], seconds: float) -> dict[str, Any]:
    """How a phase's requests ended, their rate and their latency."""
    ok = sorted(request.seconds * 1000 for request in sent if request.ok)
    unfinished = sum(
        1 for request in sent if request.status is None and request.error and "unfinished" in request.error
    )
    errors = sorted({request.error or str(request.status) for request in sent if not request.ok})
    return {
        "requests": len(sent),
        "ok": len(ok),
        "failed": len(sent) - len(ok) - unfinished,
        "unfinished": unfinished,
        "ok_per_s": round(len(ok) / max(seconds, 1e-9), 1),
        "latency_p50_ms": percentile(ok, 50),
        "latency_p99_ms": percentile(ok, 99),
        "error_samples": errors[:3],
    }


def figures(measured: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """Every figure of one point from its samples, requests and the fleets' records."""
    marks = measured["marks"]
    phases: dict[str, dict[str, Any]] = {}
    for (name, first, began), (_, last, ended) in itertools.pairwise(marks):
        phases[name] = {
            **between(first, last),
            **pass_stats(records, began, ended),
            "began": began,
            "ended": ended,
        }
    for phase in phases.values():
        ours = sum(phase["process_cpu"].values()) + phase["redis_cpu"]
        phase["others_cpu"] = round(max(0.0, phase["machine_cpu"] - ours), 3)
    idle, open_loop, closed = phases["idle"], phases["open_loop"], phases["closed_loop"]
    open_loop.update(request_stats(measured["open_sent"], measured["open_s"]))
    closed.update(request_stats(measured["closed_sent"], measured["closed_s"]))
    for phase in (open_loop, closed):
        answered = max(phase["ok"], 1)
        phase["commands_per_request"] = round(phase["commands"] / answered, 1)
        above_idle = phase["commands"] - idle["commands_per_s"] * phase["seconds"]
        phase["commands_per_request_above_idle"] = round(max(above_idle, 0.0) / answered, 1)
    held = holdings(records)
    waits, never = cold_waits(measured["open_sent"], held)
    waits_ms = sorted(wait * 1000 for wait in waits)
    open_loop["cold_requests"] = len(waits)
    open_loop["cold_never_loaded"] = never
    open_loop["cold_wait_p50_ms"] = percentile(waits_ms, 50)
    open_loop["cold_wait_p99_ms"] = percentile(waits_ms, 99)
    open_loop["cold_wait_max_ms"] = round(waits_ms[-1], 1) if waits_ms else None
    starts = [
        span for spans in held.values() for span in spans if open_loop["began"] <= span.start < marks[-1][2]
    ]
    storms, replicas = load_storms(held)
    return {
        "idle": idle,
        "open_loop": open_loop,
        "closed_loop": closed,
        "loads": len(starts),
        "load_storms": len(storms),
        "storms": storms,
        "added_replicas": replicas,
        "redis_used_memory_peak": marks[-1][1].used_memory_peak,
        "fleet_cpu_s": round(sum(record["cpu_s"] for record in records), 2),
    }


def saturated(point: dict[str, Any], cores: int) -> bool:
    """Whether the simulated workers were short of CPU (their passes then come less often, and Redis
    sees less than real workers, one per machine, would send)."""
    idle, load = point["idle"], point["open_loop"]
    per_process = load["process_cpu"].get("workers", 0.0) / max(point["processes"], 1)
    busy_cores = max(phase.get("machine_cpu", 0.0) for phase in (idle, load))
    pass_ms = max(phase["pass_p50_ms"] or 0.0 for phase in (idle, load))
    return (
        per_process >= SATURATED_CPU
        or busy_cores >= SATURATED_MACHINE * cores
        or pass_ms >= SATURATED_PASS_MS
    )


def contended(point: dict[str, Any]) -> bool:
    """Whether other work on the machine took cores the stack needed while it was measured."""
    others: float = max(point["idle"]["others_cpu"], point["open_loop"]["others_cpu"])
    return others >= CONTENDED_CPU
