"""Line charts of a benchmark's latest run, drawn as SVG from the table on its page at every build.

MkDocs runs this hook (mkdocs.yml `hooks:`). For each chart below it reads the first table under
"## Latest run" of the benchmark's page, takes the x values from the table's first column and each
series from one part of a cell written `a / b / c`, and adds `benchmarks/img/<page>.svg` to the
site. The figures stay in one place, the page's table; the picture follows them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[1]
WIDTH, HEIGHT, MARGIN = 560, 300, 56
COLOURS = ("#1f77b4", "#d62728", "#2ca02c")


@dataclass(frozen=True)
class Chart:
    page: str  # under docs/benchmarks/, without .md
    column: int  # the table's column whose cells hold the series as `a / b / c`
    series: tuple[str, ...]  # one name per part of those cells, in order
    x_label: str
    y_label: str


CHARTS = (
    Chart("path_overhead", 1, ("Switchboard", "vLLM's server"), "streams", "TTFT p50, ms"),
    Chart("embeddings", 1, ("batcher on", "batcher off", "vLLM's server"), "clients", "requests/s"),
)


def latest_table(page: Path) -> list[list[str]]:
    """The rows (cells stripped) of the first table under `## Latest run` on a page."""
    text = page.read_text().split("## Latest run", 1)[1]
    table: list[list[str]] = []
    for line in text.splitlines():
        if not line.startswith("|"):
            if table:
                break
            continue
        if not set(line) <= set("|-: "):
            table.append([cell.strip() for cell in line.strip("|").split("|")])
    return table[1:]  # without the header


def number(text: str) -> float:
    return float(re.sub(r"[^0-9.]", "", text))


def svg(chart: Chart, rows: list[list[str]]) -> str:
    """The chart as a standalone SVG: x on a log2 scale (the levels double), y from zero."""
    import math

    xs = [number(row[0]) for row in rows]
    ys = [[number(part) for part in row[chart.column].split("/")][: len(chart.series)] for row in rows]
    top = max(max(values) for values in ys) * 1.1
    left, right = math.log2(min(xs)), math.log2(max(xs))

    def at(x: float, y: float) -> tuple[float, float]:
        px = MARGIN + (math.log2(x) - left) / ((right - left) or 1) * (WIDTH - 2 * MARGIN)
        return px, HEIGHT - MARGIN - y / top * (HEIGHT - 2 * MARGIN)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<line x1="{MARGIN}" y1="{HEIGHT - MARGIN}" x2="{WIDTH - MARGIN}" y2="{HEIGHT - MARGIN}" stroke="black"/>',
        f'<line x1="{MARGIN}" y1="{MARGIN}" x2="{MARGIN}" y2="{HEIGHT - MARGIN}" stroke="black"/>',
        f'<text x="{WIDTH / 2}" y="{HEIGHT - 12}" text-anchor="middle">{chart.x_label}</text>',
        f'<text x="14" y="{HEIGHT / 2}" text-anchor="middle" transform="rotate(-90 14 {HEIGHT / 2})">{chart.y_label}</text>',
    ]
    for x in xs:
        px, _ = at(x, 0)
        parts.append(f'<text x="{px:.1f}" y="{HEIGHT - MARGIN + 16}" text-anchor="middle">{x:g}</text>')
    for step in range(5):
        value = top * step / 4
        _, py = at(xs[0], value)
        parts.append(f'<text x="{MARGIN - 6}" y="{py + 4:.1f}" text-anchor="end">{value:.0f}</text>')
    for index, name in enumerate(chart.series):
        points = " ".join(
            "{:.1f},{:.1f}".format(*at(x, values[index])) for x, values in zip(xs, ys, strict=True)
        )
        colour = COLOURS[index % len(COLOURS)]
        parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        parts.append(f'<text x="{MARGIN + 10}" y="{MARGIN + 14 * index}" fill="{colour}">{name}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def on_files(files: Any, config: Any) -> Any:
    """MkDocs' hook: add each chart to the site's files."""
    from mkdocs.structure.files import File

    for chart in CHARTS:
        rows = latest_table(DOCS / "benchmarks" / f"{chart.page}.md")
        files.append(File.generated(config, f"benchmarks/img/{chart.page}.svg", content=svg(chart, rows)))
    return files
