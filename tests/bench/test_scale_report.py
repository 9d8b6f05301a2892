"""The scale benchmark's table and picture (`bench/scale_report.py`)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from scale_report import COLUMNS, markdown_table, svg_chart


def phase(commands_per_s: float) -> dict[str, Any]:
    return {
        "commands_per_s": commands_per_s,
        "redis_cpu": 0.1,
        "commands_per_request_above_idle": 120.0,
        "commands_per_request": 80.0,
        "ok_per_s": 200.0,
        "pass_p50_ms": 5.0,
        "pass_p99_ms": 9.0,
        "cold_wait_p50_ms": 60.0,
        "cold_wait_p99_ms": 300.0,
        "process_cpu": {"workers": 0.4},
        "machine_cpu": 1.1,
    }


def results(label: str, points: list[tuple[int, int, float]]) -> dict[str, Any]:
    return {
        "label": label,
        "commit": "abc1234",
        "settings": {
            "rate": 10.0,
            "zipf": 1.1,
            "load_s": 15.0,
            "closed_clients": 16,
            "closed_s": 6.0,
            "front_doors": 1,
            "load_range_s": [0.2, 1.0],
            "keep_alive_s": 3.0,
            "max_loaded_models": 4,
        },
        "machine": {"cpu_count": 2},
        "points": [
            {
                "workers": workers,
                "models": models,
                "idle": phase(rate / 10),
                "open_loop": phase(rate),
                "closed_loop": phase(rate),
                "load_storms": 0,
                "redis_used_memory_peak": 3 * 1024**2,
            }
            for workers, models, rate in points
        ],
        "skipped": [{"workers": 100, "models": 1000, "why": "beyond this machine"}],
    }


def test_the_table_has_a_row_per_point_and_per_skipped_point() -> None:
    table = markdown_table(results("before", [(2, 10, 2000.0), (10, 300, 20000.0)]))
    lines = table.splitlines()
    assert lines[0].count("|") == len(COLUMNS) + 1
    assert lines[2].startswith("| 2 × 10 | 200 | 2,000 |")
    assert lines[3].startswith("| 10 × 300 | 2,000 | 20,000 |")
    assert lines[4].startswith("| 100 × 1000 | not run: beyond this machine |")
    assert "`before` (abc1234)" in table


def test_the_picture_draws_load_and_idle_for_every_results_file() -> None:
    runs = [results("before", [(2, 10, 2000.0), (10, 300, 20000.0)]), results("after", [(2, 10, 900.0)])]
    svg = ET.fromstring(svg_chart(runs))
    lines = svg.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 4  # two files, each a load and an idle curve
    labels = [text.text for text in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert "before: under load" in labels
    assert "after: idle" in labels
    assert "10×300" in labels
