"""The cold-start benchmark's report: the measurements per round, and the goals they are held to."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

ROWS = (  # (system, measurement, label)
    ("vllm", "fresh_first_token", "vLLM: process start -> first token"),
    ("vllm", "warm_ttft", "vLLM: warm TTFT (median)"),
    ("switchboard", "stack_ready", "SB: stack start -> /readyz"),
    ("switchboard", "background_start", "SB: ready -> background start over"),
    ("switchboard", "cold_first", "SB: cold, first ever -> first token"),
    ("switchboard", "unload", "SB: unload -> cold"),
    ("switchboard", "cold_after_unload", "SB: cold after unload -> first token"),
    ("switchboard", "swap", "SB: swap to the other model -> first token"),
    ("switchboard", "warm_ttft", "SB: warm TTFT (median)"),
)
# (label, Switchboard's measurement, vLLM's to divide it by (None: seconds), target, test (None: no goal))
GOALS: tuple[tuple[str, str, str | None, str, Callable[[float], bool] | None], ...] = (
    ("cold first ever / vLLM fresh", "cold_first", "fresh_first_token", "<= 0.1", lambda v: v <= 0.1),
    ("cold after unload / vLLM", "cold_after_unload", "fresh_first_token", "<= 0.1", lambda v: v <= 0.1),
    ("swap (s)", "swap", None, "< 5 s", lambda v: v < 5),
    ("warm TTFT SB / vLLM", "warm_ttft", "warm_ttft", "compare", None),
)


def goal_values(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each goal's value per round (ratios within a round, so both systems met the same load) and median."""
    rows = []
    for label, numerator, denominator, goal, test in GOALS:
        per_round = []
        for run in runs:
            value = run["switchboard"][numerator]["seconds"]
            if denominator is not None:
                value /= run["vllm"][denominator]["seconds"]
            per_round.append(round(value, 3))
        median = round(statistics.median(per_round), 3)
        met = None if test is None else test(median)
        rows.append({"goal": label, "target": goal, "per_round": per_round, "median": median, "met": met})
    return rows


def print_report(runs: list[dict[str, Any]], goals: list[dict[str, Any]]) -> None:
    """Seconds per round and their median, then the goals and whether each is met."""
    rounds = [f"round {run['round']}" for run in runs]
    measurements = [["measurement (s)", *rounds, "median"]]
    for system, name, label in ROWS:
        values = [run[system][name]["seconds"] for run in runs]
        measurements.append([label, *(f"{v:.3f}" for v in values), f"{statistics.median(values):.3f}"])
    verdicts = [["goal", *rounds, "median", "target", "met"]]
    for row in goals:
        values = [f"{v:.3f}" for v in [*row["per_round"], row["median"]]]
        verdicts.append(
            [row["goal"], *values, row["target"], {True: "yes", False: "NO", None: "-"}[row["met"]]]
        )
    for table in (measurements, verdicts):
        print()
        print_table(table)


def print_table(lines: list[list[str]]) -> None:
    """A header and rows of cells: the first column left-aligned, the others right-aligned."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for number, line in enumerate(lines):
        cells = zip(line, widths, strict=True)
        print("  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(cells)))
        if number == 0:
            print("  ".join("-" * w for w in widths))
