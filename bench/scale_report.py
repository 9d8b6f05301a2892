"""The scale benchmark's table (Markdown, for README) and picture (a hand-written SVG: Redis commands/s
against workers x models, one curve per results file)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Any

COLUMNS = (
    "workers × models",
    "Redis cmd/s idle",
    "Redis cmd/s load",
    "Redis CPU idle / load",
    "cmd/req load (above idle)",
    "cmd/req closed",
    "req/s closed",
    "pass p50 / p99 ms",
    "cold → load p50 / p99 ms",
    "storms",
    "Redis MiB",
    "CPU workers / machine",
)


def fmt(value: float | None, digits: int = 0) -> str:
    """A number for the table (thousands separated), or a dash when there is none."""
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def table_rows(results: dict[str, Any]) -> list[list[str]]:
    """One row per grid point measured, then one per point skipped."""
    rows = []
    for point in results["points"]:
        idle, load, closed = point["idle"], point["open_loop"], point["closed_loop"]
        rows.append(
            [
                f"{point['workers']} × {point['models']}"
                + (" *" if point.get("saturated") else "")
                + (" †" if point.get("contended") else ""),
                fmt(idle["commands_per_s"]),
                fmt(load["commands_per_s"]),
                f"{fmt(idle['redis_cpu'], 2)} / {fmt(load['redis_cpu'], 2)}",
                fmt(load["commands_per_request_above_idle"]),
                fmt(closed["commands_per_request"]),
                fmt(closed["ok_per_s"]),
                f"{fmt(load['pass_p50_ms'], 1)} / {fmt(load['pass_p99_ms'], 1)}",
                f"{fmt(load['cold_wait_p50_ms'])} / {fmt(load['cold_wait_p99_ms'])}",
                f"{point['load_storms']}",
                fmt(point["redis_used_memory_peak"] / 1024**2, 1),
                f"{fmt(load['process_cpu'].get('workers'), 2)} / {fmt(load.get('machine_cpu'), 2)}",
            ]
        )
    for skipped in results.get("skipped", []):
        rows.append(
            [f"{skipped['workers']} × {skipped['models']}", f"not run: {skipped['why']}"]
            + [""] * (len(COLUMNS) - 2)
        )
    return rows


def markdown_table(results: dict[str, Any]) -> str:
    """The README table of one results file, with a line saying how it was measured."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    settings = results["settings"]
    note = (
        f"`{results['label']}` ({results['commit']}), {settings['rate']:g} req/s Poisson over Zipf({settings['zipf']:g}) "
        f"for {settings['load_s']:g} s, closed loop {settings['closed_clients']} clients on the most popular model "
        f"for {settings['closed_s']:g} s; {settings['front_doors']} front door(s), "
        f"loads {settings['load_range_s'][0]:g}–{settings['load_range_s'][1]:g} s, keep-alive {settings['keep_alive_s']:g} s, "
        f"{settings['max_loaded_models']} models per worker at once; {results['machine']['cpu_count']} cores."
    )
    if any(point.get("saturated") for point in results["points"]):
        note += (
            " *: the simulated workers were short of CPU, so they ran fewer passes than real workers would:"
            " Redis load is understated there (see bench/README.md)."
        )
    if any(point.get("contended") for point in results["points"]):
        note += " †: other work on the machine took half a core or more while the point was measured."
    if "what_runs" in results:
        note += "\n\n" + results["what_runs"]
    return "\n".join(lines) + "\n\n" + note + "\n"


# --- the picture -----------------------------------------------------------------------------------

WIDTH, HEIGHT = 860, 500
LEFT, RIGHT, TOP, BOTTOM = 80, 250, 50, 60
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
PHASES = (("open_loop", "under load", ""), ("idle", "idle", " stroke-dasharray='6 4'"))


class _LogAxes:
    """Log-log axes over the values to draw, padded so that points and labels stay inside."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float]) -> None:
        self.x_low, self.x_high = math.floor(math.log10(min(xs))), math.log10(max(xs)) + 0.35
        self.y_low, self.y_high = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)) + 0.05)

    def x(self, value: float) -> float:
        return LEFT + (math.log10(value) - self.x_low) / (self.x_high - self.x_low) * PLOT_W

    def y(self, value: float) -> float:
        share = (math.log10(max(value, 1.0)) - self.y_low) / max(self.y_high - self.y_low, 1e-9)
        return TOP + PLOT_H - share * PLOT_H

    def grid(self) -> list[str]:
        """Grid lines and tick labels at the powers of ten."""
        parts = []
        for power in range(self.x_low, math.floor(self.x_high) + 1):
            x = self.x(10.0**power)
            parts.append(f"<line x1='{x:.1f}' y1='{TOP}' x2='{x:.1f}' y2='{TOP + PLOT_H}' stroke='#ddd'/>")
            parts.append(
                f"<text x='{x:.1f}' y='{TOP + PLOT_H + 18}' text-anchor='middle'>{10**power:,}</text>"
            )
        for power in range(self.y_low, self.y_high + 1):
            y = self.y(10.0**power)
            parts.append(f"<line x1='{LEFT}' y1='{y:.1f}' x2='{LEFT + PLOT_W}' y2='{y:.1f}' stroke='#ddd'/>")
            parts.append(f"<text x='{LEFT - 6}' y='{y + 4:.1f}' text-anchor='end'>{10**power:,}</text>")
        return parts


def svg_chart(runs: Sequence[dict[str, Any]]) -> str:
    """Redis commands/s (log) against workers x models (log): under load solid, idle dashed, one
    colour per results file; each point labelled with its workers x models, hollow where the
    simulation was short of CPU or the machine busy with other work (its numbers understated)."""
    series = [
        (run["label"], sorted(run["points"], key=lambda p: (p["workers"] * p["models"], p["workers"])))
        for run in runs
    ]
    points = [p for _, run_points in series for p in run_points]
    if not points:
        return _svg(["<text x='20' y='40'>no points measured</text>"])
    axes = _LogAxes(
        [p["workers"] * p["models"] for p in points],
        [max(p[phase]["commands_per_s"], 1.0) for p in points for phase, _, _ in PHASES],
    )
    parts = [
        f"<text x='{LEFT}' y='28' font-size='16' font-weight='bold'>Redis commands/s against workers × models</text>",
        f"<rect x='{LEFT}' y='{TOP}' width='{PLOT_W}' height='{PLOT_H}' fill='none' stroke='#444'/>",
        *axes.grid(),
        f"<text x='{LEFT + PLOT_W / 2}' y='{HEIGHT - 15}' text-anchor='middle'>"
        "workers × models (configured model slots)</text>",
        f"<text transform='translate(18 {TOP + PLOT_H / 2}) rotate(-90)' text-anchor='middle'>Redis commands/s</text>",
    ]
    for index, (label, run_points) in enumerate(series):
        colour = COLOURS[index % len(COLOURS)]
        for phase, _, dash in PHASES:
            parts += _curve(axes, run_points, phase, colour, dash)
        parts += _legend(LEFT + PLOT_W + 16, TOP + 10 + index * 44, label, colour)
    note_y = TOP + 10 + len(series) * 44
    parts.append(
        f"<circle cx='{LEFT + PLOT_W + 29}' cy='{note_y}' r='3.5' fill='white' stroke='#444' stroke-width='1.5'/>"
    )
    parts.append(f"<text x='{LEFT + PLOT_W + 48}' y='{note_y + 4}'>short of CPU or contended</text>")
    return _svg(parts)


def _curve(axes: _LogAxes, points: Sequence[dict[str, Any]], phase: str, colour: str, dash: str) -> list[str]:
    coords = [(axes.x(p["workers"] * p["models"]), axes.y(p[phase]["commands_per_s"])) for p in points]
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
    parts = [f"<polyline points='{path}' fill='none' stroke='{colour}' stroke-width='2'{dash}/>"]
    for number, ((x, y), point) in enumerate(zip(coords, points, strict=True)):
        fill = "white" if point.get("saturated") or point.get("contended") else colour
        parts.append(
            f"<circle cx='{x:.1f}' cy='{y:.1f}' r='3.5' fill='{fill}' stroke='{colour}' stroke-width='1.5'/>"
        )
        if phase == "open_loop":  # labels above and below in turn, so that neighbours do not overlap
            label_y = y - 7 if number % 2 == 0 else y + 15
            text = f"{point['workers']}×{point['models']}"
            parts.append(
                f"<text x='{x + 5:.1f}' y='{label_y:.1f}' font-size='10' fill='{colour}'>{text}</text>"
            )
    return parts


def _legend(x: int, y: int, label: str, colour: str) -> list[str]:
    parts = []
    for row, (_, words, dash) in enumerate(PHASES):
        line_y = y + row * 18
        parts.append(
            f"<line x1='{x}' y1='{line_y}' x2='{x + 26}' y2='{line_y}' stroke='{colour}' stroke-width='2'{dash}/>"
        )
        parts.append(f"<text x='{x + 32}' y='{line_y + 4}'>{escape(label)}: {words}</text>")
    return parts


def _svg(parts: list[str]) -> str:
    head = (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' "
        f"viewBox='0 0 {WIDTH} {HEIGHT}' font-family='sans-serif' font-size='12'>"
    )
    return (
        "\n".join([head, f"<rect width='{WIDTH}' height='{HEIGHT}' fill='white'/>", *parts, "</svg>"]) + "\n"
    )


def describe(point: dict[str, Any]) -> list[str]:
    """Progress lines for a measured point."""
    idle, load, closed = point["idle"], point["open_loop"], point["closed_loop"]
    cpu = ", ".join(f"{part} {value:.2f}" for part, value in load["process_cpu"].items())
    return [
        f"idle: {idle['commands_per_s']:,.0f} Redis cmd/s, Redis CPU {idle['redis_cpu']:.2f}, "
        f"{idle['passes_per_s']:.1f} passes/s (p50 {idle['pass_p50_ms']} ms)",
        f"open loop: {load['ok']}/{load['requests']} ok ({load['failed']} failed, {load['unfinished']} unfinished), "
        f"{load['commands_per_s']:,.0f} cmd/s, {load['commands_per_request_above_idle']:,.0f} cmd/req above idle, "
        f"passes p50/p99 {load['pass_p50_ms']}/{load['pass_p99_ms']} ms, "
        f"cold→load p50/p99 {load['cold_wait_p50_ms']}/{load['cold_wait_p99_ms']} ms over {load['cold_requests']}, "
        f"{point['loads']} loads, {point['load_storms']} storms",
        f"closed loop: {closed['ok_per_s']:.0f} req/s, {closed['commands_per_request']:,.0f} cmd/req, "
        f"latency p50 {closed['latency_p50_ms']} ms",
        f"CPU (cores) under load: {cpu}, Redis {load['redis_cpu']:.2f}, whole machine {load['machine_cpu']:.2f}; "
        f"others {load['others_cpu']:.2f}; load average before {point['load_1m_before']}; "
        f"Redis peak memory {point['redis_used_memory_peak'] / 1024**2:.1f} MiB",
        "top commands under load: "
        + ", ".join(f"{k} {v:,.0f}/s" for k, v in load["top_commands_per_s"].items()),
    ]
