"""The fair-share benchmark's results: one level's figures, their medians over rounds, and the table.

`bench/fair_share.py` measures; this module says what the measurements come to against issue 38's
targets.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from tables import fmt, print_aligned

# Targets of the issue: the quiet model's p50 beside a flood, over alone; the flooder's throughput
# with fair shares on, over off.
QUIET_RATIO_TARGET = 3.0
FLOOD_DROP_TARGET = 0.05


@dataclass
class Level:
    """The quiet model's times beside one flood (0 clients: alone), and the flooder's throughput."""

    flood_clients: int
    quiet_ttft_ms: list[float]
    quiet_p50_ms: float | None
    flood_tokens_per_s: float | None
    flood_requests_done: int
    errors: int
    error_samples: list[str]
    window_s: float
    load_1m_before: float
    # The worker's own measure of the quiet jobs' wait for a job slot (its slot-wait histogram's mean
    # over the level): what fair shares change, apart from the CPU the two engines share.
    quiet_slot_wait_ms_mean: float | None = None


def median_levels(rounds: list[list[Level]]) -> list[Level]:
    """One setting's levels over rounds: the medians of the quiet p50, the slot wait and the flooder's
    tokens per second; every quiet time, and the errors summed."""
    merged = []
    for levels in zip(*rounds, strict=True):
        merged.append(
            replace(
                levels[0],
                quiet_ttft_ms=[t for level in levels for t in level.quiet_ttft_ms],
                quiet_p50_ms=_median([level.quiet_p50_ms for level in levels]),
                flood_tokens_per_s=_median([level.flood_tokens_per_s for level in levels]),
                flood_requests_done=sum(level.flood_requests_done for level in levels),
                errors=sum(level.errors for level in levels),
                error_samples=sorted({e for level in levels for e in level.error_samples})[:5],
                quiet_slot_wait_ms_mean=_median([level.quiet_slot_wait_ms_mean for level in levels]),
            )
        )
    return merged


def _median(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return round(statistics.median(known), 2) if known else None


def print_table(rounds: dict[str, list[list[Level]]]) -> None:
    """Per flood: the quiet model's p50 (and its ratio to alone) and the flooder's tok/s, on and off
    (medians over rounds), and the flooder's change in each round."""
    runs = {setting: median_levels(levels) for setting, levels in rounds.items()}
    alone = {setting: levels[0].quiet_p50_ms for setting, levels in runs.items()}
    head = ["flood clients", "quiet p50 ms on (x alone)", "quiet p50 ms off (x alone)"]
    head += [
        "quiet slot wait ms on / off",
        "flood tok/s on",
        "flood tok/s off",
        "on vs off",
        "each round",
        "errors on / off",
    ]
    lines = [head]
    floods = [level.flood_clients for level in runs["on"]]
    for index, clients in enumerate(floods):
        on, off = runs["on"][index], runs["off"][index]
        cells = [str(clients) if clients else "alone"]
        for setting, level in (("on", on), ("off", off)):
            ratio = _ratio(level.quiet_p50_ms, alone[setting])
            cells.append(f"{fmt(level.quiet_p50_ms)} ({fmt(ratio, 1)}x)")
        change = _ratio(on.flood_tokens_per_s, off.flood_tokens_per_s)
        each = [
            _ratio(r_on[index].flood_tokens_per_s, r_off[index].flood_tokens_per_s)
            for r_on, r_off in zip(rounds["on"], rounds["off"], strict=True)
        ]
        cells.append(f"{fmt(on.quiet_slot_wait_ms_mean)} / {fmt(off.quiet_slot_wait_ms_mean)}")
        cells += [fmt(on.flood_tokens_per_s), fmt(off.flood_tokens_per_s)]
        cells += ["-" if change is None else f"{(change - 1) * 100:+.1f} %"]
        cells += [" ".join("-" if c is None else f"{(c - 1) * 100:+.0f}" for c in each) if clients else "-"]
        cells += [f"{on.errors} / {off.errors}"]
        lines.append(cells)
    print_aligned(lines)
    print(
        f"targets: quiet p50 within {QUIET_RATIO_TARGET:g}x alone with fair shares on; the flooder's "
        f"tok/s on within {FLOOD_DROP_TARGET:.0%} of off (medians over {len(rounds['on'])} rounds)"
    )
    for setting, levels in runs.items():
        for level in levels:
            for sample in level.error_samples:
                print(f"  ! fair shares {setting}, flood {level.flood_clients}: {sample}")


def _ratio(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else round(value / base, 3)
