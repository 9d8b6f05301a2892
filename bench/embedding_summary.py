"""The embeddings benchmark's summary: medians over rounds, the ratios, and the issue's targets."""

from __future__ import annotations

import statistics
from typing import Any

from tables import fmt, print_aligned

METRICS = ("requests_per_s", "p50_ms", "p99_ms")
ON, OFF, VLLM = "batcher-on", "batcher-off", "vllm"
# The targets: at concurrency >= 32, the batcher's requests/s over batching off's, and
# Switchboard's (batcher on) over vLLM's server's with its p50 at most so much worse; at
# concurrency 1, the batcher's p50 at most its queue delay plus this much above batching off's.
HIGH_CONCURRENCY = 32
MIN_ON_OFF_SPEEDUP = 3.0
MIN_SB_VLLM_THROUGHPUT = 1.0
MAX_SB_VLLM_P50 = 1.2
C1_P50_ALLOWANCE_MS = 2.0
# The processes named in the costs table, the costliest first.
TOP_PROCESSES = 5


def summarize_runs(runs: list[dict[str, Any]], levels: list[int], systems: list[str]) -> list[dict[str, Any]]:
    """Per level: each system's median over rounds of each metric, its errors summed, and the ratios."""
    rows = []
    for concurrency in levels:
        per_system = {system: _system_level(runs, system, concurrency) for system in systems}
        rows.append({"concurrency": concurrency, "systems": per_system, "ratios": _ratios(per_system)})
    return rows


def _system_level(runs: list[dict[str, Any]], system: str, concurrency: int) -> dict[str, Any]:
    found = [
        level
        for run in runs
        if run["system"] == system
        for level in run["levels"]
        if level["concurrency"] == concurrency
    ]
    medians: dict[str, Any] = {}
    for metric in METRICS:
        values = [level[metric] for level in found if level[metric] is not None]
        medians[metric] = round(statistics.median(values), 2) if values else None
    medians["errors"] = sum(level["errors"] for level in found)
    medians["costs"] = _median_costs([level["costs"] for level in found if level.get("costs")])
    return medians


def _median_costs(costs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The median over rounds of each cost figure (CPU per request by kind of process, and the rest)."""
    if not costs:
        return None
    kinds = {kind for cost in costs for kind in cost["cpu_ms_per_request"]}
    cpu = {kind: _median([cost["cpu_ms_per_request"].get(kind, 0.0) for cost in costs]) for kind in kinds}
    medians: dict[str, Any] = {
        "cpu_ms_per_request": dict(sorted(cpu.items(), key=lambda item: -(item[1] or 0)))
    }
    for name in ("busy_cores", "batch_rows_mean", "batcher_wait_ms_mean"):
        medians[name] = _median([cost[name] for cost in costs if cost[name] is not None])
    return medians


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def _ratios(per_system: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    on, off, vllm = per_system.get(ON, {}), per_system.get(OFF, {}), per_system.get(VLLM, {})
    return {
        "on_off_requests_per_s": ratio(on.get("requests_per_s"), off.get("requests_per_s")),
        "on_off_p50_ms": ratio(on.get("p50_ms"), off.get("p50_ms")),
        "sb_vllm_requests_per_s": ratio(on.get("requests_per_s"), vllm.get("requests_per_s")),
        "sb_vllm_p50_ms": ratio(on.get("p50_ms"), vllm.get("p50_ms")),
        "sb_vllm_p99_ms": ratio(on.get("p99_ms"), vllm.get("p99_ms")),
    }


def ratio(value: float | None, base: float | None) -> float | None:
    """value / base, or None when either is missing (or base is 0)."""
    return None if value is None or not base else round(value / base, 3)


def targets(rows: list[dict[str, Any]], queue_delay_ms: float) -> list[dict[str, Any]]:
    """Each of the issue's targets at each level it applies to: the figure, its limit, met or not
    (None where a system it needs was not run)."""
    checks = []
    for row in rows:
        concurrency, ratios = row["concurrency"], row["ratios"]
        if concurrency == 1:
            on, off = row["systems"].get(ON, {}), row["systems"].get(OFF, {})
            added = None
            if on.get("p50_ms") is not None and off.get("p50_ms") is not None:
                added = round(on["p50_ms"] - off["p50_ms"], 2)
            limit = queue_delay_ms + C1_P50_ALLOWANCE_MS
            checks.append(_check("p50 added by the batcher (ms)", concurrency, added, "<=", limit))
        if concurrency >= HIGH_CONCURRENCY:
            speedup = ratios["on_off_requests_per_s"]
            checks.append(_check("req/s batcher on / off", concurrency, speedup, ">=", MIN_ON_OFF_SPEEDUP))
            throughput = ratios["sb_vllm_requests_per_s"]
            checks.append(_check("req/s SB / vLLM", concurrency, throughput, ">=", MIN_SB_VLLM_THROUGHPUT))
            p50 = ratios["sb_vllm_p50_ms"]
            checks.append(_check("p50 SB / vLLM", concurrency, p50, "<=", MAX_SB_VLLM_P50))
    return checks


def _check(what: str, concurrency: int, value: float | None, sense: str, limit: float) -> dict[str, Any]:
    met = None if value is None else (value >= limit if sense == ">=" else value <= limit)
    return {
        "target": what,
        "concurrency": concurrency,
        "value": value,
        "sense": sense,
        "limit": limit,
        "met": met,
    }


def print_summary(rows: list[dict[str, Any]], checks: list[dict[str, Any]]) -> None:
    """The table (SB = Switchboard with the batcher on) and the targets, one line each."""
    print("\nMedians over rounds: batcher on / batcher off / vLLM's server")
    head = ["conc", "req/s", "p50 ms", "p99 ms", "req/s on/off", "req/s SB/vLLM", "p50 SB/vLLM", "errors"]
    lines = [head]
    for row in rows:
        systems, ratios = row["systems"], row["ratios"]
        cells = [str(row["concurrency"])]
        for metric in METRICS:
            cells.append(" / ".join(fmt(systems.get(s, {}).get(metric)) for s in (ON, OFF, VLLM)))
        cells += [fmt(ratios[name], 2) for name in ("on_off_requests_per_s", "sb_vllm_requests_per_s")]
        cells.append(fmt(ratios["sb_vllm_p50_ms"], 2))
        cells.append(" / ".join(str(systems.get(s, {}).get("errors", "-")) for s in (ON, OFF, VLLM)))
        lines.append(cells)
    print_aligned(lines)
    print_costs(rows)
    print("\nTargets:")
    for check in checks:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[check["met"]]
        print(
            f"  c={check['concurrency']}: {check['target']} = {fmt(check['value'], 2)}"
            f" (target {check['sense']} {check['limit']:g}): {verdict}"
        )


def print_costs(rows: list[dict[str, Any]]) -> None:
    """Where the time went, per level and system: the machine's busy cores, Switchboard's rows per
    engine call and time held in the batcher, and the CPU per request of the processes that spent most."""
    print("\nWhere the time goes (medians over rounds; CPU ms per answered request, by process)")
    lines = [["conc", "system", "busy cores", "rows/call", "batcher ms", "CPU ms/request"]]
    for row in rows:
        for system, figures in row["systems"].items():
            costs = figures.get("costs")
            if not costs:
                continue
            cpu = costs["cpu_ms_per_request"]
            top = ", ".join(f"{kind} {ms:.2f}" for kind, ms in list(cpu.items())[:TOP_PROCESSES] if ms)
            total = sum(ms for ms in cpu.values() if ms)
            cells = [str(row["concurrency"]), system, fmt(costs["busy_cores"], 2)]
            cells += [fmt(costs["batch_rows_mean"]), fmt(costs["batcher_wait_ms_mean"], 2)]
            lines.append([*cells, f"{total:.2f} = {top}"])
    if len(lines) > 1:
        print_aligned(lines)
