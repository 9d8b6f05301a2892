"""The garbage collector's pauses in Switchboard's processes over one benchmark level.

The front door and the worker export every collection's pause (`switchboard:gc_pause_seconds`, by
generation; `switchboard/gc_heap.py`). A full collection stops every stream of its process, so a
level that had one shows it in its tail: each level reads both processes' histograms before and
after, and reports the full collections it saw and the longest pause of any generation (as the
upper bound of its histogram bucket).
"""

from __future__ import annotations

import urllib.request
from typing import Any

import redis
from prometheus_client.parser import text_string_to_metric_families

from switchboard import keys
from switchboard.wire import worker_decoder

PAUSES = "switchboard:gc_pause_seconds"
Samples = dict[tuple[str, str, str], float]  # (sample name, generation, le) -> value


def metrics_urls(base_url: str, redis_url: str) -> dict[str, str]:
    """Where the front door and each worker serve their metrics (workers from their records)."""
    urls = {"front door": f"{base_url}/metrics"}
    with redis.Redis.from_url(redis_url) as client:
        for index, worker_id in enumerate(client.zrange(keys.workers_index(), 0, -1)):
            raw = client.get(keys.worker_record(worker_id.decode()))
            if raw is None:
                continue
            record = worker_decoder.decode(raw)  # type: ignore[arg-type]
            if record.metrics_port:
                name = "worker" if index == 0 else f"worker {index + 1}"
                urls[name] = f"http://127.0.0.1:{record.metrics_port}/metrics"
    return urls


def read_pauses(url: str) -> Samples:
    """One process's pause histogram now; empty when it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        if family.name == PAUSES:
            for sample in family.samples:
                key = (sample.name, sample.labels.get("generation", ""), sample.labels.get("le", ""))
                samples[key] = sample.value
    return samples


def pauses_between(before: Samples, after: Samples) -> dict[str, Any]:
    """Full collections and their milliseconds, and the longest pause of any generation (the upper
    bound of its histogram bucket, in ms), between two readings of one process."""

    def grew(name: str, generation: str, le: str = "") -> float:
        return after.get((name, generation, le), 0.0) - before.get((name, generation, le), 0.0)

    longest: float | None = None
    for name, generation, _ in after:
        new = grew(name, generation) if name == f"{PAUSES}_count" else 0.0
        if not new:
            continue
        bounds = sorted(
            (float(le), le) for (other, of, le) in after if other == f"{PAUSES}_bucket" and of == generation
        )
        # The smallest bucket that holds every new pause of this generation (+Inf holds them all).
        bound = next(value for value, le in bounds if grew(f"{PAUSES}_bucket", generation, le) >= new)
        longest = bound if longest is None else max(longest, bound)
    return {
        "full_collections": int(grew(f"{PAUSES}_count", "2")),
        "full_ms": round(grew(f"{PAUSES}_sum", "2") * 1000, 1),
        "longest_pause_ms_at_most": None if longest is None else round(longest * 1000, 1),
    }
