"""The Grafana dashboard queries only metrics the product exports, so the two cannot drift apart."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import router.routing.fallback  # registers the fallbacks' counter
import router.telemetry.front_door_metrics  # noqa: F401  (registers the front door's metrics)
import switchboard.gc_heap  # noqa: F401  (registers the garbage collector's metrics, both sides)
import workers.runtime.worker_metrics  # noqa: F401  (registers the worker's metrics)
from switchboard.metrics import REGISTRY
from tests.support.metric_samples import metric_names

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards" / "switchboard.json"

# PromQL words that look like names but are not metrics.
KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
}
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metrics_in(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (functions, keywords and labels left out)."""
    expr = _STRINGS.sub('""', expr)
    expr = _MATCHERS.sub("", expr)
    expr = _RANGES.sub("", expr)
    expr = _GROUPING.sub("", expr)
    names = set()
    for match in _NAME.finditer(expr):
        rest = expr[match.end() :].lstrip()
        if rest.startswith("(") or match.group() in KEYWORDS:
            continue  # a function or an aggregation
        names.add(match.group())
    return names


def expressions(node: Any) -> list[str]:
    """Every `expr` anywhere in the dashboard (panels, rows, variables)."""
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for value in node.values() for e in expressions(value)]
    if isinstance(node, list):
        return [e for item in node for e in expressions(item)]
    return []


def test_the_parser_finds_metric_names_and_nothing_else() -> None:
    expr = 'histogram_quantile(0.95, sum by (le, model) (rate(switchboard:ttft_bucket{state=~"a|b"}[5m]))) / on (x) up'
    assert metrics_in(expr) == {"switchboard:ttft_bucket", "up"}


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {name for expr in expressions(dashboard) for name in metrics_in(expr)}
    assert len(queried) > 15, queried
    exported = metric_names(REGISTRY)
    assert queried - exported == set(), f"the dashboard queries metrics nobody exports: {queried - exported}"


def test_the_dashboard_covers_what_the_issue_asks_for() -> None:
    text = DASHBOARD.read_text()
    for metric in (
        "switchboard:requests_total",
        "switchboard:time_to_first_token_seconds_bucket",
        "switchboard:time_per_output_token_seconds_bucket",
        "switchboard:e2e_request_latency_seconds_bucket",
        "switchboard:request_queue_time_seconds_bucket",
        "switchboard:num_requests_waiting",
        "switchboard:oldest_waiting_seconds",
        "switchboard:prompt_tokens_total",
        "switchboard:generation_tokens_total",
        "switchboard:model_loads_total",
        "switchboard:model_load_seconds_bucket",
        "switchboard:model_evictions_total",
        "switchboard:model_sleeps_total",
        "switchboard:model_wakes_total",
        "switchboard:model_resident",
        "switchboard:redis_round_trips_total",
        # The rollouts row: weights over time, rollout events, canary against stable.
        "switchboard:route_weight",
        "switchboard:route_rollout_events_total",
    ):
        assert metric in text, metric
