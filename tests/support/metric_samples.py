"""Reading the front door's Prometheus metrics in the process that runs it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from switchboard.metrics import REGISTRY


def counter(name: str, **labels: str) -> float:
    """The value of one counter sample of the front door's metrics (0 while it has none)."""
    return REGISTRY.get_sample_value(f"{name}_total", labels) or 0.0


def metric_names(registry: CollectorRegistry = REGISTRY) -> set[str]:
    """Every sample name `registry` can export (counters with `_total`, histograms with their series)."""
    names: set[str] = set()
    for family in registry.collect():
        names.add(family.name)
        if family.type == "counter":
            names |= {family.name + "_total", family.name + "_created"}
        elif family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_count", "_sum", "_created")}
        elif family.type == "summary":
            names |= {family.name + suffix for suffix in ("_count", "_sum", "_created")}
        names |= {sample.name for sample in family.samples}
    return names
